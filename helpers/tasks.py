r"""Synthetic sequence tasks, generated in code from a seed, that the tiny transformer learns.

Introduced in ``notebooks/03_mha_from_scratch.ipynb`` (a tiny model learns them in
seconds) and used by notebooks 04 (regularisation), 05 (which heads a task needs:
:class:`MixedTask` mixes relations) and 06 (which positional encoding suits which
relation; evaluation at other lengths).

Every task is a next-token problem for a causal model: ``make(n, seed)`` returns
``(inputs, targets)``, two long tensors ``(n, seq_len)``; ``targets[i, t]`` is the token
the model must emit after reading ``inputs[i, :t+1]``, or ``IGNORE_INDEX`` (-100, the
default ``ignore_index`` of ``F.cross_entropy``) at positions that are not scored, so
the loss and :func:`accuracy` count only the answers.

Tasks (the relation an attention head must implement):

* :class:`CopyTask` -- ``a_1 .. a_n SEP a_1 .. a_n`` (or reversed with
  ``reverse=True``): attend ``n + 1`` steps back (copy), or to a mirrored position (reverse).
* :class:`LookbackTask` -- "emit the token ``k`` steps back": a fixed relative offset,
  the relation RoPE expresses directly.
* :class:`AssociativeRecallTask` -- ``k_1 v_1 .. k_m v_m q_1 a_1 .. q_r a_r`` with
  ``a_j`` the value paired with key ``q_j`` (multi-query associative recall, Arora et
  al. 2023 "Zoology"): a content-based lookup that needs an induction head (Olsson et
  al. 2022, "In-context Learning and Induction Heads"), i.e. two layers.
* :class:`MixedTask` -- each example is drawn from one of several tasks, announced by a
  task token at position 0 and right-padded.
* :class:`TwoPositionTask` -- emit the ordered pair ``(x[t-a], x[t-b])``: two positions
  read at once (notebook 05: one head vs several heads at equal size).
* :class:`PairRecallTask` -- recall with each key-value pair in one token: a content task that
  one layer solves without positions (notebook 06).

Randomness comes only from an explicit ``torch.Generator`` seeded with ``seed``: the
same seed gives the same tensors on every machine.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from .validate import check_choice, check_int

__all__ = [
    "IGNORE_INDEX",
    "Task",
    "Split",
    "CopyTask",
    "LookbackTask",
    "AssociativeRecallTask",
    "MixedTask",
    "make_task",
    "accuracy",
    "TwoPositionTask",
    "PairRecallTask",
]

IGNORE_INDEX = -100


def _check_logits_targets(logits: torch.Tensor, targets: torch.Tensor) -> None:
    if not isinstance(logits, torch.Tensor) or not isinstance(targets, torch.Tensor):
        raise TypeError("logits and targets must be torch.Tensors")
    if logits.shape[:-1] != targets.shape:
        raise ValueError(
            f"logits must have shape targets.shape + (vocab,), got logits {tuple(logits.shape)} "
            f"and targets {tuple(targets.shape)}"
        )


def accuracy(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = IGNORE_INDEX) -> float:
    r"""Fraction of scored positions where the arg-max prediction is the target.

    .. math:: \text{acc} = \frac{\sum_{t:\,y_t \ne -100} [\arg\max_v z_{t,v} = y_t]}{\#\{t: y_t \ne -100\}}

    Args:
        logits: ``(..., vocab)``.
        targets: ``(...)`` long, ``ignore_index`` where not scored.

    Returns:
        A float in [0, 1] (NaN if nothing is scored).
    """
    _check_logits_targets(logits, targets)
    scored = targets != ignore_index
    n = int(scored.sum())
    if n == 0:
        return float("nan")
    correct = (logits.argmax(-1) == targets) & scored
    return int(correct.sum()) / n


@dataclass(frozen=True)
class Split:
    """Training and validation data: ``train`` and ``val`` are ``(inputs, targets)`` pairs."""

    train: tuple[torch.Tensor, torch.Tensor]
    val: tuple[torch.Tensor, torch.Tensor]


class Task:
    """Base class: a seeded generator of ``(inputs, targets)`` for a causal model.

    Subclasses set ``name``, ``vocab_size``, ``seq_len`` and implement
    ``_generate(n, generator)``. Public API:

    * ``make(n, seed)`` -> ``(inputs, targets)``, long ``(n, seq_len)``.
    * ``split(n_train, n_val, seed)`` -> :class:`Split`; no validation sequence equals a
      training sequence (duplicates are redrawn), so validation accuracy measures
      generalisation, not memorisation.
    * ``accuracy(logits, targets)`` -> accuracy over scored positions.
    * ``decode(inputs, targets)`` -> a readable string of one example.
    """

    name: str = "task"
    vocab_size: int
    seq_len: int

    def _generate(self, n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:  # pragma: no cover
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._params()})"

    def _params(self) -> str:
        return f"vocab_size={self.vocab_size}, seq_len={self.seq_len}"

    def make(self, n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """``n`` examples from ``torch.Generator().manual_seed(seed)``: ``(inputs, targets)`` ``(n, seq_len)``."""
        check_int(n, "n", 0)
        check_int(seed, "seed", 0)
        g = torch.Generator().manual_seed(seed)
        return self._generate(n, g)

    def split(self, n_train: int, n_val: int, seed: int = 0) -> Split:
        """Train and validation sets from one seeded stream; validation rows that repeat a training row are redrawn."""
        check_int(n_train, "n_train", 1)
        check_int(n_val, "n_val", 0)
        check_int(seed, "seed", 0)
        g = torch.Generator().manual_seed(seed)
        x_tr, y_tr = self._generate(n_train, g)
        seen = {tuple(row) for row in x_tr.tolist()}
        xs, ys, have = [], [], 0
        for _ in range(100):
            if have >= n_val:
                break
            x, y = self._generate(max(n_val - have, 16), g)
            keep = []
            for i, row in enumerate(x.tolist()):
                t = tuple(row)
                if t not in seen and have + len(keep) < n_val:
                    seen.add(t)
                    keep.append(i)
            xs.append(x[keep])
            ys.append(y[keep])
            have += len(keep)
        if have < n_val:
            raise ValueError(
                f"could not draw n_val={n_val} validation sequences distinct from the {n_train} training ones "
                f"(only {have}): the task has too few distinct sequences; lower n_train or n_val"
            )
        x_val = torch.cat(xs) if xs else x_tr[:0]
        y_val = torch.cat(ys) if ys else y_tr[:0]
        return Split(train=(x_tr, y_tr), val=(x_val, y_val))

    @staticmethod
    def accuracy(logits: torch.Tensor, targets: torch.Tensor) -> float:
        """Accuracy over scored positions (see :func:`accuracy`)."""
        return accuracy(logits, targets)

    def token_names(self) -> list[str]:
        """A printable name for each token id (overridden by tasks with special tokens)."""
        return [str(i) for i in range(self.vocab_size)]

    def decode(self, inputs: torch.Tensor, targets: torch.Tensor) -> str:
        """One example ``(seq_len,)`` as ``'in : ...'`` / ``'out: ...'`` lines (``.`` = not scored)."""
        names = self.token_names()
        w = max(len(s) for s in names)
        a = " ".join(names[int(t)].rjust(w) for t in inputs)
        b = " ".join(("." if int(t) == IGNORE_INDEX else names[int(t)]).rjust(w) for t in targets)
        return f"in : {a}\nout: {b}"


def _lm_pair(seq: torch.Tensor, scored_from: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Full sequences ``(n, L+1)`` -> inputs ``seq[:, :-1]``, targets ``seq[:, 1:]`` scored from index ``scored_from``."""
    inputs = seq[:, :-1].clone()
    targets = seq[:, 1:].clone()
    targets[:, :scored_from] = IGNORE_INDEX
    return inputs, targets


class CopyTask(Task):
    """Copy (or reverse) a random string after a separator.

    Full sequence ``a_1 .. a_n SEP b_1 .. b_n`` with ``b = a`` (copy) or ``b = reversed(a)``;
    inputs are its first ``2n`` tokens, targets the next token at each position, scored
    only where ``b_j`` is predicted (``n`` positions). Symbols are ``0 .. num_symbols-1``,
    ``SEP = num_symbols``; ``vocab_size = num_symbols + 1``, ``seq_len = 2 * length``.
    """

    def __init__(self, num_symbols: int = 8, length: int = 8, reverse: bool = False) -> None:
        self.num_symbols = check_int(num_symbols, "num_symbols", 2)
        self.length = check_int(length, "length", 1)
        self.reverse = bool(reverse)
        self.name = "reverse" if reverse else "copy"
        self.sep = num_symbols
        self.vocab_size = num_symbols + 1
        self.seq_len = 2 * length

    def _params(self) -> str:
        return f"num_symbols={self.num_symbols}, length={self.length}, reverse={self.reverse}"

    def token_names(self) -> list[str]:
        return [str(i) for i in range(self.num_symbols)] + ["|"]

    def _generate(self, n, g):
        a = torch.randint(0, self.num_symbols, (n, self.length), generator=g)
        b = a.flip(1) if self.reverse else a
        sep = torch.full((n, 1), self.sep, dtype=torch.long)
        return _lm_pair(torch.cat([a, sep, b], dim=1), scored_from=self.length)


class LookbackTask(Task):
    """Emit the token ``k`` steps back: ``targets[t] = inputs[t - k]`` for ``t >= k``.

    Inputs are uniform random symbols ``0 .. num_symbols-1``; the first ``k`` positions
    have nothing to look back at and are not scored. One attention head attending at the
    fixed relative offset ``-k`` solves it.
    """

    def __init__(self, num_symbols: int = 8, seq_len: int = 16, k: int = 3) -> None:
        self.num_symbols = check_int(num_symbols, "num_symbols", 2)
        self.seq_len = check_int(seq_len, "seq_len", 2)
        self.k = check_int(k, "k", 0)
        if k >= seq_len:
            raise ValueError(f"k must be < seq_len (something must be scored), got k={k}, seq_len={seq_len}")
        self.name = f"lookback{k}"
        self.vocab_size = num_symbols

    def _params(self) -> str:
        return f"num_symbols={self.num_symbols}, seq_len={self.seq_len}, k={self.k}"

    def _generate(self, n, g):
        x = torch.randint(0, self.num_symbols, (n, self.seq_len), generator=g)
        y = torch.full_like(x, IGNORE_INDEX)
        y[:, self.k :] = x[:, : self.seq_len - self.k]
        return x, y


class AssociativeRecallTask(Task):
    """Multi-query associative recall: after key-value pairs, each queried key is followed by its value.

    Full sequence ``k_1 v_1 .. k_m v_m q_1 a_1 .. q_r a_r`` where the ``m`` keys are
    distinct (drawn without replacement from ``num_keys``), the values are random, each
    query ``q_j`` is one of the keys (distinct queries when ``r <= m``) and ``a_j`` its
    value. Scored: the ``r`` answers ``a_j`` (predicted while reading ``q_j``). Keys are
    tokens ``0 .. num_keys-1``, values ``num_keys .. num_keys+num_values-1``.
    ``seq_len = 2 (m + r) - 1``.
    """

    def __init__(self, num_keys: int = 8, num_values: int = 8, num_pairs: int = 4, num_queries: int = 4) -> None:
        self.num_keys = check_int(num_keys, "num_keys", 1)
        self.num_values = check_int(num_values, "num_values", 2)
        self.num_pairs = check_int(num_pairs, "num_pairs", 1)
        self.num_queries = check_int(num_queries, "num_queries", 1)
        if num_pairs > num_keys:
            raise ValueError(f"num_pairs must be <= num_keys (keys are distinct), got num_pairs={num_pairs}, num_keys={num_keys}")
        self.name = "recall"
        self.vocab_size = num_keys + num_values
        self.seq_len = 2 * (num_pairs + num_queries) - 1

    def _params(self) -> str:
        return (f"num_keys={self.num_keys}, num_values={self.num_values}, num_pairs={self.num_pairs}, "
                f"num_queries={self.num_queries}")

    def token_names(self) -> list[str]:
        return [f"k{i}" for i in range(self.num_keys)] + [f"v{i}" for i in range(self.num_values)]

    def _generate(self, n, g):
        m, r = self.num_pairs, self.num_queries
        keys = torch.rand(n, self.num_keys, generator=g).argsort(dim=1)[:, :m]
        values = torch.randint(0, self.num_values, (n, m), generator=g) + self.num_keys
        if r <= m:
            which = torch.rand(n, m, generator=g).argsort(dim=1)[:, :r]
        else:
            which = torch.randint(0, m, (n, r), generator=g)
        queries = keys.gather(1, which)
        answers = values.gather(1, which)
        ctx = torch.stack([keys, values], dim=2).flatten(1)
        qa = torch.stack([queries, answers], dim=2).flatten(1)
        full = torch.cat([ctx, qa], dim=1)  # (n, 2m + 2r)
        inputs, targets = _lm_pair(full, scored_from=0)
        mask = torch.ones_like(targets, dtype=torch.bool)
        mask[:, 2 * m :: 2] = False  # targets at the query positions 2m, 2m+2, ... are answers
        targets[mask] = IGNORE_INDEX
        return inputs, targets


class MixedTask(Task):
    """Examples drawn uniformly from several tasks, each tagged by a task token at position 0.

    Example ``i`` from sub-task ``j``: inputs ``[TASK_j, x_1 .. x_L_j, PAD ..]``, targets
    ``[-100, y_1 .. y_L_j, -100 ..]`` (``x``, ``y`` from the sub-task; padding on the right,
    harmless for a causal model). Sub-task token ids are kept; ``TASK_j = V + j`` and
    ``PAD = V + len(tasks)`` with ``V`` the largest sub-task vocabulary.
    ``seq_len = 1 + max_j L_j``. Notebook 05 uses it to see heads specialise by relation.
    """

    def __init__(self, tasks: Sequence[Task]) -> None:
        tasks = list(tasks)
        if not tasks or not all(isinstance(t, Task) for t in tasks):
            raise ValueError(f"tasks must be a non-empty sequence of Task objects, got {tasks!r}")
        self.tasks = tasks
        base = max(t.vocab_size for t in tasks)
        self.task_tokens = [base + j for j in range(len(tasks))]
        self.pad = base + len(tasks)
        self.vocab_size = base + len(tasks) + 1
        self.seq_len = 1 + max(t.seq_len for t in tasks)
        self.name = "mixed(" + ",".join(t.name for t in tasks) + ")"

    def _params(self) -> str:
        return "[" + ", ".join(repr(t) for t in self.tasks) + "]"

    def token_names(self) -> list[str]:
        base = self.task_tokens[0]
        return [str(i) for i in range(base)] + [f"T{j}" for j in range(len(self.tasks))] + ["_"]

    def task_ids(self, inputs: torch.Tensor) -> torch.Tensor:
        """Which sub-task each row of ``inputs`` comes from: ``(n,)`` long."""
        return inputs[:, 0] - self.task_tokens[0]

    def _generate(self, n, g):
        which = torch.randint(0, len(self.tasks), (n,), generator=g)
        x = torch.full((n, self.seq_len), self.pad, dtype=torch.long)
        y = torch.full((n, self.seq_len), IGNORE_INDEX, dtype=torch.long)
        for j, task in enumerate(self.tasks):
            rows = (which == j).nonzero().flatten()
            xs, ys = task._generate(len(rows), g)
            x[rows, 0] = self.task_tokens[j]
            x[rows, 1 : 1 + task.seq_len] = xs
            y[rows, 1 : 1 + task.seq_len] = ys
        return x, y


def make_task(name: str, **kwargs) -> Task:
    """A task by name: ``"copy"``, ``"reverse"``, ``"lookback"``, ``"recall"``, or ``"mixed"``.

    ``kwargs`` go to the constructor (``"reverse"`` is ``CopyTask(reverse=True)``;
    ``"mixed"`` defaults to ``MixedTask([LookbackTask(k=2, seq_len=15), AssociativeRecallTask()])``).
    """
    check_choice(name, "name", ("copy", "reverse", "lookback", "recall", "mixed"))
    if name == "copy":
        return CopyTask(**kwargs)
    if name == "reverse":
        return CopyTask(reverse=True, **kwargs)
    if name == "lookback":
        return LookbackTask(**kwargs)
    if name == "recall":
        return AssociativeRecallTask(**kwargs)
    tasks = kwargs.pop("tasks", None) or [LookbackTask(seq_len=15, k=2), AssociativeRecallTask()]  # "mixed"
    return MixedTask(tasks, **kwargs)


class TwoPositionTask(Task):
    r"""Emit the *pair* of tokens found at two fixed offsets back: ``(x[t-a], x[t-b])``.

    Inputs are uniform random symbols ``0 .. S-1`` (``S = num_symbols``); at every position
    :math:`t \ge \max(a, b)` the target is one token that names the ordered pair,

    .. math:: y_t = S + S\cdot x_{t-a} + x_{t-b},

    so ``vocab_size = S + S^2`` (``S`` input symbols, then ``S^2`` pair tokens, printed
    ``"i:j"``). Solving it in one layer means reading two different positions *at once*:
    two heads can each copy one of them into their own subspace, while one head produces
    one convex mixture :math:`w_a v(x_{t-a}) + w_b v(x_{t-b}) + \dots` from which the order
    must be decoded (notebook 05, sec. 5).
    """

    def __init__(self, num_symbols: int = 8, seq_len: int = 12, offsets: tuple[int, int] = (1, 3)) -> None:
        self.num_symbols = check_int(num_symbols, "num_symbols", 2)
        self.seq_len = check_int(seq_len, "seq_len", 2)
        if (not isinstance(offsets, (tuple, list)) or len(offsets) != 2
                or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)):
            raise TypeError(f"offsets must be a pair of ints (a, b), got {offsets!r}")
        a, b = offsets
        if a < 1 or b < 1 or a == b or max(a, b) >= seq_len:
            raise ValueError(f"offsets must be two different ints in [1, seq_len={seq_len}), got {tuple(offsets)}")
        self.offsets = (int(a), int(b))
        self.name = f"two-position{self.offsets}"
        self.vocab_size = num_symbols + num_symbols ** 2

    def _params(self) -> str:
        return f"num_symbols={self.num_symbols}, seq_len={self.seq_len}, offsets={self.offsets}"

    def token_names(self) -> list[str]:
        S = self.num_symbols
        return [str(i) for i in range(S)] + [f"{i}:{j}" for i in range(S) for j in range(S)]

    def _generate(self, n, g):
        S, n_pos = self.num_symbols, self.seq_len
        a, b = self.offsets
        m = max(a, b)
        x = torch.randint(0, S, (n, n_pos), generator=g)
        y = torch.full_like(x, IGNORE_INDEX)
        y[:, m:] = S + S * x[:, m - a : n_pos - a] + x[:, m - b : n_pos - b]
        return x, y


# ------------------------------------------------------------------------- notebook 06
class PairRecallTask(AssociativeRecallTask):
    r"""Associative recall with one token per key-value pair: a pure *content* task.

    Full input ``p_1 .. p_m  q_1 .. q_r``: ``m`` pair tokens, each naming a key and its value
    (keys distinct, drawn from ``num_keys``; values random from ``num_values``), then ``r``
    query tokens, each naming one of the stored keys (distinct queries when ``r <= m``, else
    drawn with replacement). The target at query :math:`q_j` is the value stored with that key.

    Token ids: pair ``(key a, value b)`` is ``a * V + b``; query for key ``a`` is ``K V + a``;
    answer ``b`` is ``K V + K + b`` (``K = num_keys``, ``V = num_values``), so
    ``vocab_size = K V + K + V`` and ``seq_len = m + r``. Printed as ``a=b``, ``?a``, ``=b``.

    The answer depends only on *which* tokens occurred, not on where: one attention layer
    solves it by matching the query's key with the pair tokens' keys, with or without
    positions. The draws are those of :class:`~helpers.tasks.AssociativeRecallTask` (same
    arguments, same seed, same facts and questions), repacked: there key and value are
    separate tokens, which needs the relation "next to" and two layers; here nothing
    positional is required. Lengths beyond training come from more queries over the same
    ``m`` pairs.
    """

    def __init__(self, num_keys: int = 8, num_values: int = 4, num_pairs: int = 6, num_queries: int = 10) -> None:
        super().__init__(num_keys, num_values, num_pairs, num_queries)
        self.name = "pair-recall"
        self.vocab_size = num_keys * num_values + num_keys + num_values
        self.seq_len = num_pairs + num_queries

    def token_names(self) -> list[str]:
        K, V = self.num_keys, self.num_values
        return [f"{a}={b}" for a in range(K) for b in range(V)] + [f"?{a}" for a in range(K)] + [f"={b}" for b in range(V)]

    def _generate(self, n, g):
        K, V, m = self.num_keys, self.num_values, self.num_pairs
        x, y = super()._generate(n, g)  # k_1 v_1 .. k_m v_m q_1 a_1 .. q_r (values and answers offset by K)
        keys, values = x[:, 0 : 2 * m : 2], x[:, 1 : 2 * m : 2] - K
        queries, answers = x[:, 2 * m :: 2], y[:, 2 * m :: 2] - K
        inputs = torch.cat([keys * V + values, K * V + queries], dim=1)
        targets = torch.full_like(inputs, IGNORE_INDEX)
        targets[:, m:] = K * V + K + answers
        return inputs, targets
