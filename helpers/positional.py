r"""Experiments on positional encodings: shifted positions, longer sequences, stretched RoPE.

Taught in ``notebooks/06_positional_encodings_compared.ipynb``, which trains one
:class:`~helpers.model.TinyTransformer` per positional scheme (``pos`` in ``"none"``,
``"sinusoidal"``, ``"learned"``, ``"rope"``) and then evaluates the *same* trained models

* with every position shifted by a constant (``offset``, shift invariance),
* on sequences 2x and 4x longer than in training (length extrapolation),
* with RoPE stretched by position interpolation or NTK-aware base scaling.

What is here:

* :func:`rope_attention_modules`, :func:`use_rope_base` -- find the RoPE attention modules
  of a model and temporarily change their base (NTK-aware scaling, bloc97 2023, with
  :func:`helpers.rope.ntk_scaled_base`).
* :func:`init_position_table_` -- re-draw a learned position table from
  :math:`\mathcal N(0, \sigma^2)` with an explicit generator (GPT-2's released code draws its
  position table ``wpe`` with :math:`\sigma = 0.01` and its token table ``wte`` with 0.02;
  0.02 is Hugging Face's ``GPT2Config.initializer_range``, used there for both tables; ``nn.Embedding``'s
  default, which ``TinyTransformer`` keeps, is :math:`\sigma = 1`).
* :func:`position_similarity` -- cosine similarity between the rows of a position table
  (what a trained learned table holds: neighbours similar, far positions not).
* :func:`shift_angles` -- how far a shift by ``c`` turns each (sin, cos) pair of the
  sinusoidal table, wrapped to :math:`(-\pi, \pi]` (aliasing of the fast pairs).
* :func:`interpolated_positions` -- the positions of position interpolation (Chen et al.
  2023): :math:`m \mapsto m / s`, passed to ``model(tokens, positions=...)``.
* :func:`accuracy_by_position` -- accuracy at each position of the sequence (where
  extrapolation starts to fail).
* :func:`relative_position_bucket`, :func:`t5_bias`, :class:`T5BiasTransformer` -- T5's
  bucketed relative position bias (Raffel et al. 2020): one learned scalar per (bucket, head)
  added to the scores, distances 0 .. ``num_buckets//2 - 1`` in buckets of their own, longer
  ones in logarithmically wider buckets up to ``max_distance``, all beyond in the last one
  (the bucket function as Hugging Face's ``T5Attention._relative_position_bucket``).
* :class:`ShiftLengthGrid`, :func:`shift_length_grid` -- accuracies of several models on a
  grid of offsets x lengths, and one attention map per cell: what the notebook's explorer
  shows (precomputed once, deterministically).

Papers: Vaswani et al. 2017 (sinusoidal and learned embeddings, sec. 3.5, Table 3 row E);
Su et al. 2021 (RoPE); Press et al. 2022 (ALiBi, ``TinyTransformer(pos="alibi")``; extrapolation of sinusoidal and rotary);
Kazemnejad et al. 2023 (NoPE); Chen et al. 2023 (position interpolation); bloc97 2023 and
Peng et al. 2023 (NTK-aware scaling, YaRN).
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping, Optional, Sequence

import numpy as np
import torch
from torch import nn

from .attention import MultiHeadAttention
from .heads import attention_at_offset
from .model import TinyTransformer
from .tasks import IGNORE_INDEX
from .train import evaluate
from .validate import check_number

__all__ = [
    "rope_attention_modules",
    "use_rope_base",
    "init_position_table_",
    "position_similarity",
    "shift_angles",
    "interpolated_positions",
    "accuracy_by_position",
    "ShiftLengthGrid",
    "shift_length_grid",
    "relative_position_bucket",
    "t5_bias",
    "T5BiasTransformer",
]

Data = tuple[torch.Tensor, torch.Tensor]


# ------------------------------------------------------------------------- RoPE knobs
def rope_attention_modules(model: nn.Module) -> list[MultiHeadAttention]:
    """Every :class:`~helpers.attention.MultiHeadAttention` of ``model`` that applies RoPE.

    Raises:
        TypeError: if ``model`` is not an ``nn.Module``.
        ValueError: if it has no RoPE attention (e.g. ``TinyTransformer(pos="learned")``).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    mods = [m for m in model.modules() if isinstance(m, MultiHeadAttention) and m.rope]
    if not mods:
        raise ValueError(
            f"model has no RoPE attention (no MultiHeadAttention with rope=True); "
            f"got {type(model).__name__} with pos={getattr(model, 'pos', '?')!r}"
        )
    return mods


@contextlib.contextmanager
def use_rope_base(model: nn.Module, base: float) -> Iterator[nn.Module]:
    r"""Temporarily set the RoPE base of every attention layer of ``model`` to ``base``.

    With ``base = ntk_scaled_base(10000, s, head_dim)`` this is NTK-aware scaling (bloc97
    2023): :math:`\theta'_i = \theta_i s^{-2i/(d-2)}`. The previous bases are restored on
    exit, also after an exception. Inside the ``with`` block the model can be evaluated
    or fine-tuned (``helpers.train``) with the new base.

    Example::

        with use_rope_base(model, ntk_scaled_base(10000.0, 2.0, model.d_model // model.num_heads)):
            loss, acc = evaluate(model, long_data)
    """
    base = check_number(base, "base")
    mods = rope_attention_modules(model)
    old = [m.rope_base for m in mods]
    for m in mods:
        m.rope_base = base
    try:
        yield model
    finally:
        for m, b in zip(mods, old):
            m.rope_base = b


# ------------------------------------------------------------------------- learned table
@torch.no_grad()
def init_position_table_(model: nn.Module, std: float, generator: torch.Generator) -> nn.Module:
    r"""Re-initialise the learned position table of ``model`` in place: :math:`P_{m,j} \sim \mathcal N(0, \sigma^2)`.

    ``TinyTransformer(pos="learned")`` keeps ``nn.Embedding``'s default :math:`\sigma = 1`, so
    every position vector starts as large as a token embedding; GPT-2 (Radford et al. 2019,
    released code ``openai/gpt-2`` ``src/model.py``) draws its position table ``wpe`` with
    :math:`\sigma = 0.01` (and its token table ``wte`` with 0.02), near zero. Rows that are
    never trained keep whatever is drawn here.

    Args:
        model: a module with a ``pos_emb`` ``nn.Embedding`` (``TinyTransformer(pos="learned")``);
            its table ``(max_len, d_model)`` is overwritten (same device and dtype).
        std: :math:`\sigma`, a finite number > 0.
        generator: a ``torch.Generator`` on the table's device (the draw is reproducible).

    Returns:
        ``model`` (for chaining).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    table = getattr(model, "pos_emb", None)
    if not isinstance(table, nn.Embedding):
        raise ValueError(
            f"model has no learned position table (pos_emb must be an nn.Embedding); "
            f"got pos={getattr(model, 'pos', '?')!r}"
        )
    if isinstance(std, bool) or not isinstance(std, (int, float)) or not (math.isfinite(std) and std > 0):
        raise ValueError(f"std must be a finite number > 0, got {std!r}")
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    w = table.weight
    draw = torch.randn(w.shape, generator=generator, dtype=torch.float32, device=generator.device)
    w.copy_(draw.to(device=w.device, dtype=w.dtype) * std)
    return model


def interpolated_positions(seq_len: int, scale: float) -> torch.Tensor:
    r"""Position interpolation (Chen et al. 2023): positions :math:`m / s` for :math:`m = 0 .. L'-1`.

    With :math:`s = L'/L` a sequence of length :math:`L'` is squeezed into the position
    range :math:`[0, L)` the model was trained on (fractional positions; RoPE only).
    ``model(tokens, positions=interpolated_positions(L2, L2 / L))`` gives the same
    rotations as :func:`helpers.rope.apply_rope` with ``scale=s``.

    Args:
        seq_len: :math:`L'`, an int >= 1.
        scale: :math:`s`, a number > 0 (1 gives ``0 .. L'-1``).

    Returns:
        float32 tensor ``(seq_len,)``.
    """
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise ValueError(f"seq_len must be an int >= 1, got {seq_len!r}")
    scale = check_number(scale, "scale", "a finite number > 0 (L'/L)")
    return torch.arange(seq_len, dtype=torch.float64).div(scale).to(torch.float32)


@torch.no_grad()
def position_similarity(table: torch.Tensor) -> torch.Tensor:
    r"""Cosine similarity between every pair of rows of a position table.

    .. math:: S_{mn} = \frac{\mathbf P_m^\top \mathbf P_n}{\lVert \mathbf P_m \rVert\,\lVert \mathbf P_n \rVert}

    A table whose rows are independent random vectors gives :math:`S \approx I` (off-diagonal
    entries of order :math:`1/\sqrt d`); a trained table shows which positions it treats as
    alike (e.g. a band: neighbours similar).

    Args:
        table: ``(positions, d)`` float tensor (e.g. ``model.pos_emb.weight[:L]``).

    Returns:
        ``(positions, positions)`` float64 tensor with ones on the diagonal.
    """
    if not isinstance(table, torch.Tensor) or table.dim() != 2 or not table.is_floating_point():
        raise ValueError(f"table must be a 2-D float tensor (positions, d), got "
                         f"{tuple(table.shape) if isinstance(table, torch.Tensor) else type(table).__name__}")
    t = table.detach().to(torch.float64)
    norms = t.norm(dim=1)
    if bool((norms == 0).any()):
        raise ValueError("table has an all-zero row: its cosine similarity is undefined")
    u = t / norms[:, None]
    return u @ u.T


def shift_angles(offset: float, d_model: int, base: float = 10000.0) -> torch.Tensor:
    r"""The angle by which a shift of every position by ``offset`` turns each (sin, cos) pair of the sinusoidal table.

    Pair :math:`i` of :math:`\mathbf p_m` is :math:`(\sin m\omega_i, \cos m\omega_i)` with
    :math:`\omega_i = \text{base}^{-2i/d}`; :math:`\mathbf p_{m+c}` turns it by :math:`c\,\omega_i`. What
    the network sees is that angle modulo :math:`2\pi`, returned wrapped to :math:`(-\pi, \pi]`: a
    fast pair whose :math:`c\,\omega_i` is close to a whole number of turns looks almost unshifted
    (aliasing).

    Args:
        offset: the shift :math:`c` (a finite number).
        d_model: even width :math:`d` of the table.
        base: 10000 in Vaswani et al. (2017).

    Returns:
        float64 tensor ``(d_model // 2,)``, pair 0 (fastest) first.
    """
    if isinstance(offset, bool) or not isinstance(offset, (int, float)) or not math.isfinite(offset):
        raise ValueError(f"offset must be a finite number, got {offset!r}")
    if isinstance(d_model, bool) or not isinstance(d_model, int) or d_model < 2 or d_model % 2:
        raise ValueError(f"d_model must be an even int >= 2, got {d_model!r}")
    base = check_number(base, "base")
    omega = base ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    a = torch.remainder(offset * omega + math.pi, 2 * math.pi) - math.pi  # [-pi, pi)
    return torch.where(a == -math.pi, torch.full_like(a, math.pi), a)


# ------------------------------------------------------------------------- metrics
@torch.no_grad()
def accuracy_by_position(model: nn.Module, data: Data, **forward_kwargs) -> torch.Tensor:
    r"""Accuracy at each position :math:`t` over the rows where :math:`t` is scored.

    .. math:: \text{acc}_t = \frac{\#\{i: y_{i,t} \ne -100,\ \arg\max_v z_{i,t,v} = y_{i,t}\}}{\#\{i: y_{i,t} \ne -100\}}

    Args:
        model: maps ``(batch, seq)`` tokens to ``(batch, seq, vocab)`` logits.
        data: ``(inputs, targets)``, long ``(batch, seq)``.
        **forward_kwargs: passed to ``model(inputs, ...)`` (``offset``, ``positions``).

    Returns:
        float64 tensor ``(seq,)``; NaN where no row is scored. Eval mode is used and the
        model's mode restored.
    """
    if (not isinstance(data, (tuple, list)) or len(data) != 2
            or not all(isinstance(t, torch.Tensor) for t in data)):
        raise TypeError(f"data must be a pair (inputs, targets) of tensors, got {type(data).__name__}")
    x, y = data
    if x.dim() != 2 or x.shape != y.shape:
        raise ValueError(f"inputs and targets must both have shape (batch, seq), got {tuple(x.shape)} and {tuple(y.shape)}")
    was_training = model.training
    model.eval()
    try:
        pred = model(x, **forward_kwargs).argmax(-1)
    finally:
        model.train(was_training)
    scored = y != IGNORE_INDEX
    n = scored.sum(0).double()
    correct = ((pred == y) & scored).sum(0).double()
    return torch.where(n > 0, correct / n.clamp_min(1), torch.full_like(n, float("nan")))


# ------------------------------------------------------------- the explorer's grid
@dataclass
class ShiftLengthGrid:
    """Accuracies and attention maps of several trained models over offsets x lengths.

    Attributes:
        schemes: model group names (e.g. ``["none", "sinusoidal", "learned", "rope"]``).
        offsets: the position offsets evaluated (ints).
        lengths: the sequence lengths evaluated (ints).
        accuracy: ``{scheme: (seeds, len(offsets), len(lengths))}`` numpy float64
            (NaN where the model cannot run, e.g. a learned table too short).
        maps: ``{scheme: (len(offsets), len(lengths), max_len, max_len)}`` numpy float32:
            one head's attention weights on one example (the first model of the scheme),
            NaN-padded to the longest length so every map has the same shape.
        head: ``{scheme: head index}``: the head shown (the one attending most at offset
            ``-lookback`` at offset 0, train length; head 0 if ``lookback`` is None).
        tokens: ``{length: list of ints}``: the example shown at each length.
    """

    schemes: list[str]
    offsets: list[int]
    lengths: list[int]
    accuracy: dict[str, np.ndarray]
    maps: dict[str, np.ndarray]
    head: dict[str, int]
    tokens: dict[int, list[int]]

    def mean_accuracy(self, scheme: str) -> np.ndarray:
        """``(len(offsets), len(lengths))``: accuracy averaged over the models of ``scheme``."""
        return self.accuracy[scheme].mean(0)


@torch.no_grad()
def shift_length_grid(
    models: Mapping[str, Sequence[nn.Module]],
    make_data: Callable[[int], Data],
    offsets: Sequence[int],
    lengths: Sequence[int],
    lookback: Optional[int] = None,
    example: int = 0,
) -> ShiftLengthGrid:
    """Evaluate every model at every (offset, length); keep one attention map per cell.

    Args:
        models: ``{scheme: [model_seed0, model_seed1, ...]}`` (single-layer maps are taken
            from layer 0).
        make_data: ``make_data(length) -> (inputs, targets)``, deterministic (the same
            validation set for every model).
        offsets: position offsets (``model(x, offset=o)``), ints >= 0.
        lengths: sequence lengths, ints >= 1.
        lookback: for a lookback task, the offset ``k`` used to pick the head to show.
        example: the row of the data whose attention map is kept.

    Returns:
        :class:`ShiftLengthGrid`. A model that cannot run at some cell (``ValueError``:
        a learned table shorter than ``offset + length``) gets NaN there and an all-NaN map.
    """
    if not isinstance(models, Mapping) or not models or not all(len(v) > 0 for v in models.values()):
        raise ValueError("models must be a non-empty dict of scheme -> non-empty list of models")
    offsets, lengths = [int(o) for o in offsets], [int(n) for n in lengths]
    if not offsets or min(offsets) < 0:
        raise ValueError(f"offsets must be a non-empty list of ints >= 0, got {offsets}")
    if not lengths or min(lengths) < 1:
        raise ValueError(f"lengths must be a non-empty list of ints >= 1, got {lengths}")
    data = {n: make_data(n) for n in lengths}
    for n, (x, _) in data.items():
        if x.shape[1] != n:
            raise ValueError(f"make_data({n}) must return sequences of length {n}, got shape {tuple(x.shape)}")
    n_max = max(lengths)
    acc, maps, heads = {}, {}, {}
    for scheme, group in models.items():
        a = np.full((len(group), len(offsets), len(lengths)), np.nan)
        mp = np.full((len(offsets), len(lengths), n_max, n_max), np.nan, dtype=np.float32)
        first = group[0]
        first.eval()
        h = 0
        if lookback is not None:
            first(data[lengths[0]][0][: example + 1])
            h = int(attention_at_offset(torch.stack(first.attention_weights), lookback)[0].argmax())
        heads[scheme] = h
        for j, n in enumerate(lengths):
            x = data[n][0]
            for i, o in enumerate(offsets):
                for s, model in enumerate(group):
                    try:
                        a[s, i, j] = evaluate(model, data[n], offset=o, need_weights=False)[1]
                    except ValueError as err:
                        if "max_len" not in str(err):
                            raise
                        continue
                    if s == 0:
                        model(x[example : example + 1], offset=o)
                        mp[i, j, :n, :n] = model.attention_weights[0][0, h].numpy()
        acc[scheme], maps[scheme] = a, mp
    tokens = {n: data[n][0][example].tolist() for n in lengths}
    return ShiftLengthGrid(list(models), offsets, lengths, acc, maps, heads, tokens)



# ------------------------------------------------------------- T5's relative position bias
def _check_buckets(num_buckets, max_distance, bidirectional) -> int:
    """Validate T5's bucket settings; return ``max_exact`` (the number of one-distance buckets per direction)."""
    if not isinstance(bidirectional, bool):
        raise TypeError(f"bidirectional must be a bool, got {type(bidirectional).__name__}")
    least = 4 if bidirectional else 2
    if isinstance(num_buckets, bool) or not isinstance(num_buckets, int) or num_buckets < least or (
            bidirectional and num_buckets % 2):
        rule = "an even int >= 4 (half of them per direction)" if bidirectional else "an int >= 2"
        raise ValueError(f"num_buckets must be {rule} when bidirectional={bidirectional}, got {num_buckets!r}")
    max_exact = (num_buckets // 2 if bidirectional else num_buckets) // 2
    if isinstance(max_distance, bool) or not isinstance(max_distance, int) or max_distance <= max_exact:
        raise ValueError(f"max_distance must be an int > max_exact = {max_exact} (the last exact distance + 1; "
                         f"the log buckets span max_exact .. max_distance), got {max_distance!r}")
    return max_exact


def relative_position_bucket(relative_position: torch.Tensor, bidirectional: bool = True, num_buckets: int = 32,
                             max_distance: int = 128) -> torch.Tensor:
    r"""T5's bucket of each relative position :math:`r = j - i` (key position minus query position).

    Raffel et al. (2020, sec. 2.1) give each bucket of distances one learned scalar per head,
    added to the attention logits. With ``bidirectional=False`` (a causal decoder) only
    :math:`r \le 0` counts and :math:`d = \max(-r, 0)` is the distance back; with ``True`` half of
    the buckets are for keys after the query (:math:`r > 0`) and :math:`d = |r|`. Per direction
    with :math:`B` buckets (``num_buckets``, halved if bidirectional), :math:`E = \lfloor B/2 \rfloor`
    and :math:`D` = ``max_distance``:

    .. math:: b(d) = \begin{cases} d & d < E \\
              \min\!\big(B-1,\ E + \big\lfloor \frac{\ln(d/E)}{\ln(D/E)}\,(B-E) \big\rfloor\big) & d \ge E \end{cases}

    so the distances :math:`E .. D-1` share :math:`B-E` logarithmically wider buckets and every
    distance :math:`\ge D` lands in the last one. Same arithmetic (float32 log) as Hugging Face's
    ``T5Attention._relative_position_bucket`` (``transformers/models/t5/modeling_t5.py``), which
    the tests compare it with.

    Args:
        relative_position: integer tensor of any shape, :math:`j - i`.
        bidirectional: False for a causal (decoder) model.
        num_buckets: :math:`B` in total (T5: 32); an even int >= 4 if bidirectional, else an int >= 2.
        max_distance: :math:`D` (T5: 128), an int > :math:`E`.

    Returns:
        long tensor of the same shape, values in ``[0, num_buckets)``.
    """
    if not isinstance(relative_position, torch.Tensor) or relative_position.is_floating_point() or \
            relative_position.is_complex() or relative_position.dtype == torch.bool:
        raise TypeError("relative_position must be an integer tensor (key position - query position), got "
                        + (f"dtype {relative_position.dtype}" if isinstance(relative_position, torch.Tensor)
                           else type(relative_position).__name__))
    max_exact = _check_buckets(num_buckets, max_distance, bidirectional)
    r = relative_position.long()
    buckets = torch.zeros_like(r)
    per_dir = num_buckets
    if bidirectional:
        per_dir = num_buckets // 2
        buckets = buckets + (r > 0).long() * per_dir
        d = r.abs()
    else:
        d = (-r).clamp_min(0)
    # the log branch in float32 with a Python-float divisor, as Hugging Face computes it
    large = max_exact + (torch.log(d.float() / max_exact) / math.log(max_distance / max_exact)
                         * (per_dir - max_exact)).to(torch.long)
    large = large.clamp_max(per_dir - 1)
    return buckets + torch.where(d < max_exact, d, large)


def t5_bias(positions: torch.Tensor, table: torch.Tensor, max_distance: int, causal: bool = True) -> torch.Tensor:
    r"""T5's additive attention bias :math:`\beta_{h,\,b(p_j - p_i)}` from a ``(num_buckets, heads)`` table.

    With ``causal=True`` keys after the query (by index, as :func:`~helpers.attention.causal_mask`)
    get :math:`-\infty`, and the buckets are unidirectional. It depends on positions only through
    :math:`p_j - p_i`, so a constant shift of every position changes nothing.

    Args:
        positions: ``(seq,)`` or ``(batch, seq)`` integer-valued positions.
        table: ``(num_buckets, heads)`` float tensor (``T5BiasTransformer.rel_bias.weight``);
            gradients flow into it.
        max_distance: as in :func:`relative_position_bucket`.
        causal: unidirectional buckets and the causal mask (True), or bidirectional, no mask.

    Returns:
        ``(heads, seq, seq)`` or ``(batch, heads, seq, seq)`` in ``table``'s dtype.
    """
    if not isinstance(positions, torch.Tensor) or positions.dim() not in (1, 2):
        raise ValueError(f"positions must be a (seq,) or (batch, seq) tensor, got "
                         f"{tuple(positions.shape) if isinstance(positions, torch.Tensor) else type(positions).__name__}")
    if not isinstance(table, torch.Tensor) or table.dim() != 2 or not table.is_floating_point():
        raise ValueError(f"table must be a (num_buckets, heads) float tensor, got "
                         f"{tuple(table.shape) if isinstance(table, torch.Tensor) else type(table).__name__}")
    if positions.is_floating_point():
        if not bool((positions == positions.round()).all()):
            raise ValueError("T5's relative bias needs integer positions (buckets of whole distances), "
                             "got fractional positions (position interpolation is for RoPE)")
        positions = positions.round()
    p = positions.long()
    rel = p[..., None, :] - p[..., :, None]  # (..., seq_q, seq_k): j - i
    buckets = relative_position_bucket(rel, bidirectional=not causal, num_buckets=table.shape[0],
                                       max_distance=max_distance)
    bias = table[buckets]  # (..., seq_q, seq_k, heads)
    bias = bias.movedim(-1, -3)  # (..., heads, seq_q, seq_k)
    if causal:
        n = p.shape[-1]
        allowed = torch.ones(n, n, dtype=torch.bool, device=p.device).tril()
        bias = bias.masked_fill(~allowed, float("-inf"))
    return bias


class T5BiasTransformer(TinyTransformer):
    r"""A :class:`~helpers.model.TinyTransformer` with T5's bucketed relative position bias instead of an encoding.

    No position is added to the embeddings (``pos="none"`` underneath); every layer adds the
    *same* learned bias :math:`\beta_{h,\,b(j-i)}` (one ``nn.Embedding(num_buckets, num_heads)``
    shared by the layers, as T5 computes it in its first layer and reuses it) to head
    :math:`h`'s scaled scores, with unidirectional buckets and the causal mask. The other
    parameters are drawn exactly as in ``TinyTransformer(..., pos="none", seed=seed)``; the
    bias table is then drawn from :math:`\mathcal N(0, d_{model}^{-1})` (Hugging Face's T5
    initialisation, ``std = factor * d_model ** -0.5`` with ``factor = 1``) with a generator
    seeded by ``seed``. (T5 itself does not scale the query-key product; here the bias is added
    after the :math:`1/\sqrt{d_k}` of :func:`~helpers.attention.scaled_dot_product_attention`.)

    Args:
        vocab_size, d_model, num_heads, num_layers, max_len: as :class:`~helpers.model.TinyTransformer`.
        num_buckets: unidirectional buckets (T5's default 32).
        max_distance: distances >= this share the last bucket (T5's default 128).
        seed: as :class:`~helpers.model.TinyTransformer`.
        **kwargs: other :class:`~helpers.model.TinyTransformer` arguments (not ``pos`` or ``causal``).
    """

    def __init__(self, vocab_size: int, d_model: int, num_heads: int, num_layers: int, max_len: int,
                 num_buckets: int = 32, max_distance: int = 128, seed: Optional[int] = None, **kwargs) -> None:
        for bad in ("pos", "causal"):
            if bad in kwargs:
                raise TypeError(f"T5BiasTransformer fixes {bad} (pos='none' plus the bias, causal=True); "
                                f"do not pass {bad}=")
        _check_buckets(num_buckets, max_distance, False)
        super().__init__(vocab_size, d_model, num_heads, num_layers, max_len, pos="none", causal=True, seed=seed,
                         **kwargs)
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.rel_bias = nn.Embedding(num_buckets, num_heads)
        gen = torch.Generator()
        if seed is not None:
            gen.manual_seed(seed)
        else:
            gen.seed()
        with torch.no_grad():
            self.rel_bias.weight.copy_(torch.randn(num_buckets, num_heads, generator=gen) * d_model ** -0.5)

    def extra_repr(self) -> str:
        return (f"pos='t5' (relative bias, num_buckets={self.num_buckets}, max_distance={self.max_distance}), "
                f"causal=True, norm={self.norm!r}, max_len={self.max_len}")

    def _attention_mask(self, n: int, pos: Optional[torch.Tensor], cache, device) -> torch.Tensor:
        if cache is not None:
            raise ValueError("T5BiasTransformer does not support a KV cache (cache= must be None)")
        p = pos if pos is not None else torch.arange(n, device=device)
        return t5_bias(p, self.rel_bias.weight, self.max_distance, causal=True)
