r"""A small, deterministic training loop for the tiny models of the series.

Introduced in ``notebooks/03_mha_from_scratch.ipynb`` (train the tiny transformer
on a synthetic task) and used by notebooks 04 (``loss_fn`` for label smoothing,
``penalty`` for L1/L2, ``weight_decay``; residual dropout in the model), 05 (train,
then prune heads) and 06 (one model per positional encoding).

Objective (cross-entropy over the scored positions, targets ``-100`` ignored):

.. math::
    \mathcal{L}(\theta) = -\frac{1}{|S|}\sum_{(i,t)\in S} \log p_\theta(y_{i,t} \mid x_{i,\le t})
    \;+\; \text{penalty}(\theta)

optimised with AdamW (Loshchilov & Hutter 2019: decoupled ``weight_decay``).

Determinism: the batch order comes from a ``torch.Generator`` seeded with ``seed``, and
the global RNG (dropout) is re-seeded with ``seed`` inside ``torch.random.fork_rng``, so
the caller's random state is left untouched: on a CUDA model ``torch.manual_seed`` re-seeds
the CPU and every CUDA device and all of them are forked; on any other device only the
CPU generator is re-seeded and forked (the CUDA generators are not touched). With
``helpers.seed_everything`` (one thread, deterministic algorithms) the same call gives
bit-identical losses on the same machine. Nothing is printed unless ``progress=True``
(one final line) or ``log_every > 0``.

Devices: :func:`train` and :func:`evaluate` follow the model. Each batch is moved to the
device of the model's first parameter (the CPU for a model without parameters), so data
made on the CPU by :mod:`helpers.tasks` trains a model moved with ``model.cuda()``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Union

import torch
import torch.nn.functional as F
from torch import nn

from .tasks import IGNORE_INDEX, Split, Task, accuracy

__all__ = ["TrainResult", "cross_entropy_loss", "evaluate", "train", "model_device", "to_device"]

Data = tuple[torch.Tensor, torch.Tensor]


def model_device(model: nn.Module) -> torch.device:
    """The device of ``model``'s first parameter; the CPU for a model without parameters."""
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def to_device(batch: tuple[torch.Tensor, ...], device: torch.device) -> tuple[torch.Tensor, ...]:
    """Each tensor of ``batch`` on ``device`` (no copy for those already there)."""
    return tuple(t.to(device) for t in batch)


def _rng_devices(device: torch.device) -> tuple[list[int], Optional[str]]:
    """What ``torch.random.fork_rng`` must save and restore around seeded work on a model at ``device``.

    ``torch.manual_seed`` re-seeds every CUDA device, so on CUDA all of them are forked
    (``(list(range(device_count)), "cuda")``); off CUDA only the CPU state is
    (``([], None)``).
    """
    if device.type == "cuda":
        return list(range(torch.cuda.device_count())), "cuda"
    return [], None


def cross_entropy_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    r"""Mean cross-entropy over scored positions: ``F.cross_entropy`` with ``ignore_index=-100``.

    Args:
        logits: ``(batch, seq, vocab)``; targets: ``(batch, seq)`` long.

    Returns:
        A scalar tensor.
    """
    return F.cross_entropy(logits.flatten(0, -2), targets.flatten(), ignore_index=IGNORE_INDEX)


@dataclass
class TrainResult:
    """What :func:`train` returns.

    Attributes:
        losses: training loss (including the penalty) at every step, floats.
        train_loss, train_acc, val_loss, val_acc: final metrics in eval mode (the
            loss here is the plain ``loss_fn``, without penalty); ``val_*`` are NaN
            without validation data.
        steps: the number of optimisation steps taken (fewer than asked when
            ``stop_at_acc`` was reached).
        history: ``(step, val_loss, val_acc)`` at every ``eval_every`` steps.
        seconds: wall-clock time of the loop (varies between runs: never print it in a
            notebook cell that nbval compares).
    """

    losses: list[float]
    train_loss: float
    train_acc: float
    val_loss: float
    val_acc: float
    steps: int
    history: list[tuple[int, float, float]] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> str:
        """One deterministic line: steps, last loss and the final metrics, rounded."""
        return (f"steps {self.steps}  loss {self.losses[-1]:.4f}  train acc {self.train_acc:.3f}  "
                f"val loss {self.val_loss:.4f}  val acc {self.val_acc:.3f}")


@torch.no_grad()
def evaluate(
    model: nn.Module,
    data: Data,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = cross_entropy_loss,
    batch_size: int = 1024,
    **forward_kwargs,
) -> tuple[float, float]:
    """Loss and accuracy of ``model`` on ``data = (inputs, targets)`` in eval mode.

    The loss is averaged over scored positions (batches weighted by their count of scored
    positions); ``forward_kwargs`` go to ``model(inputs, ...)`` (e.g. ``head_mask``,
    ``offset``). Each batch is moved to the model's device (its first parameter's; the
    CPU without parameters). The model's train/eval mode is restored afterwards.

    Returns:
        ``(loss, accuracy)`` as floats (NaN, NaN for empty data).
    """
    x, y = _check_data(data, "data")
    if len(x) == 0:
        return float("nan"), float("nan")
    was_training = model.training
    device = model_device(model)
    model.eval()
    try:
        total_loss, total_correct, total_n = 0.0, 0, 0
        for i in range(0, len(x), batch_size):
            xb, yb = to_device((x[i : i + batch_size], y[i : i + batch_size]), device)
            logits = model(xb, **forward_kwargs)
            n = int((yb != IGNORE_INDEX).sum())
            if n == 0:
                continue
            total_loss += float(loss_fn(logits, yb)) * n
            total_correct += round(accuracy(logits, yb) * n)
            total_n += n
    finally:
        model.train(was_training)
    if total_n == 0:
        return float("nan"), float("nan")
    return total_loss / total_n, total_correct / total_n


def _check_data(data, name: str) -> Data:
    if (not isinstance(data, (tuple, list)) or len(data) != 2
            or not all(isinstance(t, torch.Tensor) for t in data)):
        raise TypeError(f"{name} must be a pair (inputs, targets) of tensors, got {type(data).__name__}")
    x, y = data
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"{name}: inputs and targets must have the same number of rows, got {x.shape[0]} and {y.shape[0]}")
    return x, y


def _resolve_data(data, n_train: int, n_val: int, seed: int) -> tuple[Data, Optional[Data]]:
    if isinstance(data, Task):
        s = data.split(n_train, n_val, seed)
        return s.train, (s.val if n_val > 0 else None)
    if isinstance(data, Split):
        return _check_data(data.train, "data.train"), _check_data(data.val, "data.val")
    if isinstance(data, (tuple, list)) and len(data) == 2 and isinstance(data[0], torch.Tensor):
        return _check_data(data, "data"), None
    if isinstance(data, (tuple, list)) and len(data) == 2:
        return _check_data(data[0], "data[0] (train)"), _check_data(data[1], "data[1] (val)")
    raise TypeError(
        "data must be a Task, a Split, an (inputs, targets) pair or a pair of such pairs "
        f"(train, val), got {type(data).__name__}"
    )


def train(
    model: nn.Module,
    data: Union[Task, Split, Data, tuple[Data, Data]],
    *,
    steps: int = 500,
    batch_size: int = 64,
    lr: float = 3e-3,
    weight_decay: float = 0.0,
    seed: int = 0,
    n_train: int = 2048,
    n_val: int = 512,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = cross_entropy_loss,
    penalty: Optional[Callable[[nn.Module], torch.Tensor]] = None,
    optimizer: Optional[Callable[[list], torch.optim.Optimizer]] = None,
    grad_clip: Optional[float] = 1.0,
    eval_every: int = 0,
    stop_at_acc: Optional[float] = None,
    progress: bool = False,
    log_every: int = 0,
    forward_kwargs: Optional[dict] = None,
) -> TrainResult:
    r"""Train ``model`` in place on a task or on given data; return losses and final metrics.

    Each step draws a batch (epochs of a seeded random permutation), moves it to the
    model's device (its first parameter's), computes
    ``loss_fn(model(inputs), targets) + penalty(model)``, back-propagates, clips the
    gradient norm to ``grad_clip`` and takes an optimiser step. The caller's CPU random
    state, and on CUDA every CUDA device's, is the same after the call as before.

    Args:
        model: maps ``(batch, seq)`` long tokens to ``(batch, seq, vocab)`` logits.
        data: a :class:`~helpers.tasks.Task` (then ``task.split(n_train, n_val, seed)`` is
            used), a :class:`~helpers.tasks.Split`, an ``(inputs, targets)`` pair (no
            validation), or ``((x_train, y_train), (x_val, y_val))``.
        steps: optimisation steps, >= 1.
        batch_size: examples per step.
        lr: learning rate.
        weight_decay: AdamW's decoupled weight decay (all parameters).
        seed: seeds the batch order, the split of a Task, and dropout.
        n_train, n_val: sizes when ``data`` is a Task.
        loss_fn: ``loss_fn(logits, targets) -> scalar``; default mean cross-entropy over
            scored positions (notebook 04 passes a label-smoothed loss).
        penalty: ``penalty(model) -> scalar`` added to the loss (e.g. an L1 or L2 term).
        optimizer: ``optimizer(params) -> torch.optim.Optimizer``; default
            ``AdamW(params, lr=lr, weight_decay=weight_decay)``.
        grad_clip: max global gradient norm, or None for no clipping.
        eval_every: evaluate on the validation data every this many steps (0: only at the end).
        stop_at_acc: stop early once validation accuracy (checked every ``eval_every``
            steps) reaches this value.
        progress: print one final summary line (nothing else).
        log_every: print a line every this many steps (0: never; avoid in nbval'd cells).
        forward_kwargs: extra keyword arguments for ``model(...)`` during training and evaluation.

    Returns:
        :class:`TrainResult`. The model is left in eval mode (dropout off).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    for name, val, lo in (("steps", steps, 1), ("batch_size", batch_size, 1), ("seed", seed, 0),
                          ("eval_every", eval_every, 0), ("log_every", log_every, 0)):
        if isinstance(val, bool) or not isinstance(val, int) or val < lo:
            raise ValueError(f"{name} must be an int >= {lo}, got {val!r}")
    if not (isinstance(lr, (int, float)) and lr > 0):
        raise ValueError(f"lr must be a number > 0, got {lr!r}")
    if not (isinstance(weight_decay, (int, float)) and weight_decay >= 0):
        raise ValueError(f"weight_decay must be a number >= 0, got {weight_decay!r}")
    if stop_at_acc is not None and eval_every == 0:
        raise ValueError("stop_at_acc needs eval_every > 0 (validation accuracy is checked every eval_every steps)")
    fkw = dict(forward_kwargs or {})
    train_data, val_data = _resolve_data(data, n_train, n_val, seed)
    if stop_at_acc is not None and val_data is None:
        raise ValueError("stop_at_acc needs validation data")
    x, y = train_data
    n = len(x)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = optimizer(params) if optimizer is not None else torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)

    g = torch.Generator().manual_seed(seed)
    device = model_device(model)
    rng_devices, rng_type = _rng_devices(device)
    losses: list[float] = []
    history: list[tuple[int, float, float]] = []
    t0 = time.perf_counter()
    step = 0
    with torch.random.fork_rng(devices=rng_devices, device_type=rng_type):
        if device.type == "cuda":
            torch.manual_seed(seed)  # the CPU and every CUDA device, all forked above
        else:
            torch.default_generator.manual_seed(seed)  # the CPU only: CUDA generators are not forked here
        model.train()
        perm, pos = torch.randperm(n, generator=g), 0
        for step in range(1, steps + 1):
            if pos + batch_size > n:
                perm, pos = torch.randperm(n, generator=g), 0
            idx = perm[pos : pos + batch_size]
            pos += batch_size
            xb, yb = to_device((x[idx], y[idx]), device)
            logits = model(xb, **fkw)
            loss = loss_fn(logits, yb)
            if penalty is not None:
                loss = loss + penalty(model)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if grad_clip is not None:
                torch.nn.utils.clip_grad_norm_(params, grad_clip)
            opt.step()
            losses.append(float(loss.detach()))
            if log_every and step % log_every == 0:
                print(f"step {step:5d}  loss {losses[-1]:.4f}")
            if eval_every and step % eval_every == 0 and val_data is not None:
                vl, va = evaluate(model, val_data, loss_fn, **fkw)
                history.append((step, vl, va))
                if stop_at_acc is not None and va >= stop_at_acc:
                    break
    seconds = time.perf_counter() - t0
    tl, ta = evaluate(model, train_data, loss_fn, **fkw)
    vl, va = evaluate(model, val_data, loss_fn, **fkw) if val_data is not None else (float("nan"), float("nan"))
    model.eval()
    result = TrainResult(losses=losses, train_loss=tl, train_acc=ta, val_loss=vl, val_acc=va,
                         steps=step, history=history, seconds=seconds)
    if progress:
        print(result.summary())
    return result
