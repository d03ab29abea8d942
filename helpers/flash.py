r"""FlashAttention from scratch: online softmax, tiled attention, recomputation backward, split-KV decoding.

Taught in ``notebooks/08_attention_cost_flashattention.ipynb``. Everything here is a **teaching
implementation**: the tiles are visited by a Python loop and each tile is a handful of ordinary
torch operations, so it shows the algorithm and its memory footprint, not the speed of the real
kernels (which fuse the whole loop into one GPU kernel that keeps each tile in on-chip memory).

Contents
--------
* :func:`online_softmax_update` -- one step of the online softmax (Milakov & Gimelshein 2018)
  carried with a value accumulator: the running maximum :math:`m`, normaliser :math:`\ell` and
  unnormalised output :math:`\mathbf a`, updated with one block of scores and values.
* :func:`online_softmax` -- ``softmax`` along the last axis computed block by block with it.
* :func:`merge_attention_partials` -- combine attention results over disjoint key sets from
  their outputs and log-sum-exps (the reduction step of flash-decoding).
* :func:`flash_attention_forward` -- the tiled forward pass in the form of FlashAttention-2's
  Algorithm 1 (Dao 2023: query blocks outside, key blocks inside, one division by :math:`\ell` at
  the end; FlashAttention's Algorithm 1, Dao et al. 2022, has the loops the other way round), with a
  causal mask (tiles above the diagonal skipped), a key padding mask and grouped-query attention;
  returns the output and the log-sum-exp of each row.
* :class:`FlashAttentionFunction`, :func:`flash_attention` -- the same as a differentiable
  ``torch.autograd.Function`` whose backward saves only ``q, k, v``, the output and the
  log-sum-exp and recomputes the probabilities tile by tile (FlashAttention-2, Dao 2023, §3.1.1 and
  Algorithm 2; FlashAttention's Algorithm 4, Dao et al. 2022, saves :math:`m` and :math:`\ell` instead).
* :func:`split_kv_decode` -- one decoding query against a long KV cache cut into chunks, each
  attended to separately and merged with :func:`merge_attention_partials` (flash-decoding's split of
  the KV sequence across thread blocks; not the warp-level "split-K" that FlashAttention-2 §3.3 removes).
* :func:`materialized_attention` -- the plain version, scores materialised: the baseline.
* :func:`causal_tile_counts`, :func:`score_matrix_bytes`, :func:`tiled_working_bytes` -- exact counts.

The peak memory of a call (``peak_memory``, notebook 08 §3) is measured by :mod:`helpers.lab.memory`.

Conventions: tensors are ``(batch, heads, seq, head_dim)``; ``k`` and ``v`` may have fewer heads
than ``q`` (grouped-query attention: query head ``i`` reads K/V head ``i // (heads_q / heads_kv)``,
as ``repeat_interleave`` and ``F.scaled_dot_product_attention(enable_gqa=True)`` do);
``key_padding_mask`` is a bool ``(batch, seq_k)`` tensor, **True for a real token**; ``causal``
requires ``seq_q == seq_k``. A query row with no allowed key gets output 0 and log-sum-exp
:math:`-\infty` (``F.scaled_dot_product_attention`` also returns 0 there in torch 2.13).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from .validate import check_int, check_tensor

__all__ = [
    "online_softmax_update", "online_softmax", "merge_attention_partials", "materialized_attention",
    "flash_attention_forward", "FlashAttentionFunction", "flash_attention", "split_kv_decode",
    "causal_tile_counts", "score_matrix_bytes", "tiled_working_bytes",
    "FlashStats",
]

_NEG_INF = float("-inf")


# ------------------------------------------------------------------------------ checks
def _check_qkv(q, k, v, causal, key_padding_mask, scale) -> tuple[int, float]:
    """Validate the attention inputs; return (query heads per K/V head, scale)."""
    for t, name in ((q, "q"), (k, "k"), (v, "v")):
        check_tensor(t, name, floating=True, dim=4)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must have the same dtype, got {q.dtype}, {k.dtype} and {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k and v must be on the same device, got {q.device}, {k.device} and {v.device}")
    B, H, Lq, d = q.shape
    if d < 1:
        raise ValueError(f"head_dim (dim -1 of q) must be at least 1, got q {tuple(q.shape)}")
    if k.shape[0] != B or v.shape[0] != B:
        raise ValueError(f"q, k and v must have the same batch size, got {q.shape[0]}, {k.shape[0]} and {v.shape[0]}")
    if k.shape[-1] != d:
        raise ValueError(f"q and k must have the same head_dim (dim -1), got q {tuple(q.shape)} and k {tuple(k.shape)}")
    if k.shape[1] != v.shape[1] or k.shape[2] != v.shape[2]:
        raise ValueError(f"k and v must have the same heads and seq_k (dims 1, 2), got k {tuple(k.shape)} and v {tuple(v.shape)}")
    Hkv = k.shape[1]
    if H < 1 or Hkv < 1:
        raise ValueError(f"q and k must each have at least 1 head (dim 1), got q {tuple(q.shape)} and k {tuple(k.shape)}")
    if H % Hkv != 0:
        raise ValueError(f"the number of query heads ({H}) must be a multiple of the number of K/V heads ({Hkv}) "
                         f"(grouped-query attention), got q {tuple(q.shape)} and k {tuple(k.shape)}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__} ({causal!r})")
    if causal and Lq != k.shape[2]:
        raise ValueError(f"causal=True needs seq_q == seq_k (which way a rectangular causal mask aligns is a "
                         f"convention; pass the mask you mean instead), got seq_q {Lq} and seq_k {k.shape[2]}")
    if key_padding_mask is not None:
        if not isinstance(key_padding_mask, torch.Tensor) or key_padding_mask.dtype != torch.bool:
            got = key_padding_mask.dtype if isinstance(key_padding_mask, torch.Tensor) else type(key_padding_mask).__name__
            raise TypeError(f"key_padding_mask must be a bool tensor (True = a real token), got {got}")
        if tuple(key_padding_mask.shape) != (B, k.shape[2]):
            raise ValueError(f"key_padding_mask must have shape (batch, seq_k) = {(B, k.shape[2])}, "
                             f"got {tuple(key_padding_mask.shape)}")
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    elif isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be a positive finite number (default 1/sqrt(head_dim)), got {scale!r}")
    return H // Hkv, float(scale)


# ---------------------------------------------------------------------- online softmax
def online_softmax_update(
    m: torch.Tensor, l: torch.Tensor, acc: Optional[torch.Tensor], s: torch.Tensor, v: Optional[torch.Tensor] = None
) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    r"""One block of the online softmax (Milakov & Gimelshein 2018, Algorithm 3, with a value accumulator).

    With the running maximum :math:`m`, normaliser :math:`\ell = \sum_j e^{s_j - m}` and
    accumulator :math:`\mathbf a = \sum_j e^{s_j - m}\,\mathbf v_j` over the keys seen so far, a
    new block of scores :math:`s_{1..B}` (and values :math:`\mathbf v_{1..B}`) gives

    .. math::
        m' = \max(m, \max_j s_j),\qquad
        \ell' = e^{m - m'}\,\ell + \sum_j e^{s_j - m'},\qquad
        \mathbf a' = e^{m - m'}\,\mathbf a + \sum_j e^{s_j - m'}\,\mathbf v_j .

    At the end :math:`\mathbf a / \ell` is the softmax-weighted average of the values and
    :math:`m + \log \ell` the log-sum-exp of all the scores. Start from :math:`m = -\infty`,
    :math:`\ell = 0`, :math:`\mathbf a = 0`.

    **The masked-block guard.** While every score seen is :math:`-\infty` (a block entirely masked,
    e.g. padding or the future of a causal row), :math:`m' = -\infty` and :math:`s_j - m'` is
    :math:`-\infty - (-\infty) = \text{NaN}`. The exponents are therefore taken relative to
    :math:`m'` replaced by 0 where it is :math:`-\infty` (the terms are :math:`e^{-\infty} = 0`
    either way), so the state stays :math:`(-\infty, 0, 0)` instead of turning NaN.

    Args:
        m: running maximum ``(...)``.
        l: running normaliser ``(...)``, same shape.
        acc: running accumulator ``(..., d)``, or ``None`` to track the normaliser only.
        s: the block's scores ``(..., B)`` (masked scores are ``-inf``).
        v: the block's values ``(..., B, d)``; required when ``acc`` is given.

    Returns:
        ``(m', l', acc')`` (``acc'`` is ``None`` when ``acc`` is).
    """
    check_tensor(m, "m", floating=True)
    check_tensor(l, "l", floating=True)
    check_tensor(s, "s", floating=True, min_dim=1)
    if m.shape != l.shape:
        raise ValueError(f"m and l must have the same shape, got m {tuple(m.shape)} and l {tuple(l.shape)}")
    if s.shape[:-1] != m.shape:
        raise ValueError(f"s must have shape (*m.shape, block) = {tuple(m.shape)} + (block,), got {tuple(s.shape)}")
    if acc is not None:
        check_tensor(acc, "acc", floating=True)
        if v is None:
            raise ValueError("v must be given when acc is (the accumulator sums exp(s - m) * v)")
        check_tensor(v, "v", floating=True)
        if acc.shape[:-1] != m.shape:
            raise ValueError(f"acc must have shape (*m.shape, d) = {tuple(m.shape)} + (d,), got {tuple(acc.shape)}")
        if v.shape != s.shape + acc.shape[-1:]:
            raise ValueError(f"v must have shape (*s.shape, d) = {tuple(s.shape) + tuple(acc.shape[-1:])}, got {tuple(v.shape)}")
    dtypes = {name: t.dtype for name, t in (("m", m), ("l", l), ("s", s), ("acc", acc), ("v", v)) if t is not None}
    if len(set(dtypes.values())) > 1:
        raise TypeError(f"m, l, s (and acc, v) must share one dtype, got {dtypes}")
    return _update(m, l, acc, s, v)


def _update(m, l, acc, s, v, shared=False):
    """The update; ``shared``: ``v`` is one ``(block, d)`` value block for every row of ``s`` (a tile), so ``p @ v``."""
    m_new = torch.maximum(m, s.amax(dim=-1))
    m_safe = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)  # the masked-block guard
    alpha = torch.exp(m - m_safe)               # rescales what was summed relative to the old maximum
    p = torch.exp(s - m_safe.unsqueeze(-1))     # the block's terms relative to the new maximum
    l_new = alpha * l + p.sum(dim=-1)
    if acc is None:
        return m_new, l_new, None
    pv = p @ v if shared else (p.unsqueeze(-2) @ v).squeeze(-2)
    acc_new = alpha.unsqueeze(-1) * acc + pv
    return m_new, l_new, acc_new


def online_softmax(x: torch.Tensor, block_size: int) -> torch.Tensor:
    r"""``torch.softmax(x, dim=-1)`` computed in one pass over blocks of ``block_size`` entries.

    The running maximum and normaliser are updated per block (:func:`online_softmax_update`), then
    each entry is :math:`e^{x_j - m}/\ell`. A row that is entirely :math:`-\infty` gives zeros
    (``torch.softmax`` gives NaN there). Shapes: ``(..., n) -> (..., n)``.
    """
    check_tensor(x, "x", floating=True, min_dim=1)
    check_int(block_size, "block_size")
    m = torch.full(x.shape[:-1], _NEG_INF, dtype=x.dtype, device=x.device)
    l = torch.zeros_like(m)
    for j in range(0, x.shape[-1], block_size):
        m, l, _ = _update(m, l, None, x[..., j:j + block_size], None)
    m_safe = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    l_safe = torch.where(l == 0, torch.ones_like(l), l)
    return torch.exp(x - m_safe.unsqueeze(-1)) / l_safe.unsqueeze(-1)


def merge_attention_partials(
    outs: Sequence[torch.Tensor], lses: Sequence[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Combine attention over disjoint sets of keys from each part's output and log-sum-exp.

    Part :math:`i` attended to its keys alone: :math:`\mathbf o_i = \sum_{j\in i} e^{s_j - \lambda_i}\mathbf v_j`
    with :math:`\lambda_i = \log\sum_{j\in i} e^{s_j}`. Over all keys
    :math:`\lambda = \log\sum_i e^{\lambda_i}` and :math:`\mathbf o = \sum_i e^{\lambda_i - \lambda}\,\mathbf o_i`,
    computed relative to :math:`\max_i \lambda_i` so nothing overflows; a part with no allowed key
    (:math:`\lambda_i = -\infty`, :math:`\mathbf o_i = 0`) gets weight 0, and when every part is empty
    the result is 0 with log-sum-exp :math:`-\infty` (no NaN). This is the reduction of
    flash-decoding (Dao et al. 2023, blog "Flash-Decoding for long-context inference").

    Args:
        outs: the parts' outputs, each ``(..., d)``, all the same shape.
        lses: their log-sum-exps, each ``(...)``.

    Returns:
        ``(out (..., d), lse (...))``.
    """
    if isinstance(outs, torch.Tensor) or isinstance(lses, torch.Tensor):
        raise TypeError("outs and lses must be sequences (lists or tuples) of tensors, one per part")
    outs, lses = list(outs), list(lses)
    if not outs:
        raise ValueError("outs must hold at least one part, got none")
    if len(outs) != len(lses):
        raise ValueError(f"outs and lses must have the same length, got {len(outs)} and {len(lses)}")
    for i, (o, s) in enumerate(zip(outs, lses)):
        check_tensor(o, f"outs[{i}]", floating=True, min_dim=1)
        check_tensor(s, f"lses[{i}]", floating=True)
        if o.shape != outs[0].shape:
            raise ValueError(f"outs[{i}] has shape {tuple(o.shape)}, outs[0] {tuple(outs[0].shape)}: all must match")
        if s.shape != o.shape[:-1]:
            raise ValueError(f"lses[{i}] must have shape outs[{i}].shape[:-1] = {tuple(o.shape[:-1])}, got {tuple(s.shape)}")
    lse_stack = torch.stack(lses)                    # (parts, ...)
    big = lse_stack.amax(dim=0)
    big_safe = torch.where(torch.isneginf(big), torch.zeros_like(big), big)
    w = torch.exp(lse_stack - big_safe)              # (parts, ...); 0 for an empty part
    total = w.sum(dim=0)
    out = (w.unsqueeze(-1) * torch.stack(outs)).sum(dim=0) / torch.where(total == 0, torch.ones_like(total), total).unsqueeze(-1)
    lse = torch.where(total == 0, torch.full_like(total, _NEG_INF), big_safe + torch.log(total))
    return out, lse


# ------------------------------------------------------------------ plain (materialised)
def materialized_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
    key_padding_mask: Optional[torch.Tensor] = None, scale: Optional[float] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Plain attention with the ``(batch, heads, seq_q, seq_k)`` scores materialised; the baseline.

    :math:`S = \text{scale}\cdot QK^\top` (masked entries :math:`-\infty`), :math:`P = \operatorname{softmax}(S)`,
    output :math:`PV`; returns ``(output, lse)`` with ``lse = logsumexp(S, -1)``. Rows with no
    allowed key: output 0, lse ``-inf``. Same arguments and conventions as :func:`flash_attention_forward`
    (GQA by ``repeat_interleave`` of K and V).
    """
    group, scale = _check_qkv(q, k, v, causal, key_padding_mask, scale)
    if group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    s = (q * scale) @ k.transpose(-2, -1)
    allowed = _allowed(q.shape[0], q.shape[2], k.shape[2], causal, key_padding_mask, q.device)
    if allowed is not None:
        s = s.masked_fill(~allowed, _NEG_INF)
    lse = torch.logsumexp(s, dim=-1)
    dead = torch.isneginf(lse)
    p = torch.exp(s - torch.where(dead, torch.zeros_like(lse), lse).unsqueeze(-1))
    return p @ v, lse


def _allowed(B, Lq, Lk, causal, key_padding_mask, device, q0=0, k0=0, bq=None, bk=None):
    """The allowed-entries mask of the tile rows q0..q0+bq, keys k0..k0+bk, broadcastable to (B, H, bq, bk); None if all allowed."""
    bq = Lq if bq is None else bq
    bk = Lk if bk is None else bk
    mask = None
    if causal:
        rows = torch.arange(q0, q0 + bq, device=device).unsqueeze(-1)
        cols = torch.arange(k0, k0 + bk, device=device)
        mask = (cols <= rows)[None, None]                                   # (1, 1, bq, bk)
    if key_padding_mask is not None:
        pad = key_padding_mask[:, k0:k0 + bk][:, None, None, :]              # (B, 1, 1, bk)
        mask = pad if mask is None else (mask & pad)
    return mask


# ------------------------------------------------------------------------ tiled forward
@dataclass
class FlashStats:
    """What one tiled pass did: tiles of scores computed and skipped (causal), and the tile shape."""

    tiles_computed: int = 0
    tiles_skipped: int = 0
    block_q: int = 0
    block_k: int = 0

    @property
    def tiles_total(self) -> int:
        return self.tiles_computed + self.tiles_skipped


def causal_tile_counts(seq_len: int, block_q: int, block_k: int) -> tuple[int, int]:
    r"""``(computed, total)`` tiles of a causal ``seq_len x seq_len`` score matrix cut into ``block_q x block_k`` tiles.

    A tile (query rows :math:`[i_0, i_1)`, keys :math:`[j_0, j_1)`) is skipped when every key is in
    the future of every row, :math:`j_0 > i_1 - 1`; the rest are computed (those on the diagonal
    partly masked). With :math:`T` = ``ceil(seq_len / block)`` square tiles per side this is
    :math:`T(T+1)/2` of :math:`T^2`: about half.
    """
    check_int(seq_len, "seq_len")
    check_int(block_q, "block_q")
    check_int(block_k, "block_k")
    computed = 0
    for i0 in range(0, seq_len, block_q):
        last_row = min(i0 + block_q, seq_len) - 1
        computed += len(range(0, min(last_row + 1, seq_len), block_k))
    return computed, math.ceil(seq_len / block_q) * math.ceil(seq_len / block_k)


def flash_attention_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
    key_padding_mask: Optional[torch.Tensor] = None, scale: Optional[float] = None,
    block_q: int = 64, block_k: int = 64, stats: Optional[FlashStats] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Tiled attention forward (FlashAttention-2's Algorithm 1, Dao 2023).

    For each block of ``block_q`` query rows (outer loop) the running statistics :math:`m, \ell`
    and the unnormalised output :math:`\mathbf A` start at :math:`(-\infty, 0, 0)`; for each block of
    ``block_k`` keys (inner loop) the tile :math:`S = \text{scale}\cdot Q_i K_j^\top` is computed,
    masked, and folded in with :func:`online_softmax_update`. The output is divided by
    :math:`\ell` once, at the end of the row block (FlashAttention-2's change, §3.1.1: Algorithm 1 of
    FlashAttention, Dao et al. 2022, rescales the output in memory at every step), and the log-sum-exp
    :math:`m + \log\ell` is kept for the backward pass. With ``causal`` the tiles entirely in the
    future are never computed. Peak extra memory, besides the output and the log-sum-exp: three
    ``block_q x block_k`` tiles per head (the scores :math:`S`, the temporary :math:`S - m'` and
    :math:`P` while it is built), the ``(batch, heads, block_q, d)`` accumulator and scaled query
    block, and a few row vectors, instead of the whole ``seq_q x seq_k`` matrix (notebook 08 §3
    accounts for every byte at ``L = 4096``).

    Args:
        q: ``(batch, heads, seq_q, d)``; k, v: ``(batch, heads_kv, seq_k, d)`` and ``(..., d_v)``,
            ``heads`` a multiple of ``heads_kv`` (grouped-query attention, without copying K/V).
        causal: query ``i`` sees keys ``j <= i`` (``seq_q == seq_k``).
        key_padding_mask: bool ``(batch, seq_k)``, True for a real token.
        scale: default :math:`1/\sqrt d`.
        block_q, block_k: tile sizes (>= 1; the last tile may be smaller).
        stats: a :class:`FlashStats` to fill with the tile counts (optional).

    Returns:
        ``(output (batch, heads, seq_q, d_v), lse (batch, heads, seq_q))``; the output has the input
        dtype, the lse (and, inside, the statistics and accumulator) float32 for bfloat16/float16
        input, as real kernels accumulate; rows with no allowed key:
        output 0, lse ``-inf``.
    """
    group, scale = _check_qkv(q, k, v, causal, key_padding_mask, scale)
    check_int(block_q, "block_q")
    check_int(block_k, "block_k")
    if stats is not None and not isinstance(stats, FlashStats):
        raise TypeError(f"stats must be a FlashStats or None, got {type(stats).__name__}")
    return _flash_forward(q, k, v, causal, key_padding_mask, scale, block_q, block_k, group, stats)


def _work_dtype(dtype):
    r"""The dtype the running statistics, the accumulator and the gradients are kept in.

    Real kernels take bfloat16/float16 inputs but accumulate in float32: with 8 (bfloat16) or 11
    (float16) mantissa bits, adding small terms to a large running sum :math:`\ell` or accumulator
    loses them, and the error grows with the sequence length. float32 and float64 stay as they are.
    """
    return torch.promote_types(dtype, torch.float32)


def _grouped(q, k, v, group):
    """Views for GQA without copying: q (B, Hkv, G, Lq, d), k/v (B, Hkv, 1, Lk, d)."""
    B, H, Lq, d = q.shape
    return q.view(B, H // group, group, Lq, d), k.unsqueeze(2), v.unsqueeze(2)


def _flash_forward(q, k, v, causal, key_padding_mask, scale, block_q, block_k, group, stats):
    B, H, Lq, _ = q.shape
    Lk, dv = k.shape[2], v.shape[-1]
    q5, k5, v5 = _grouped(q, k, v, group)
    pad5 = None if key_padding_mask is None else key_padding_mask[:, None, None, None, :]  # (B, 1, 1, 1, Lk)
    work = _work_dtype(q.dtype)        # statistics and accumulator: float32 for bfloat16/float16 input
    out = torch.empty(B, H // group, group, Lq, dv, dtype=q.dtype, device=q.device)
    lse = torch.empty(B, H // group, group, Lq, dtype=work, device=q.device)
    if stats is not None:
        stats.block_q, stats.block_k = block_q, block_k
    for i0 in range(0, Lq, block_q):
        i1 = min(i0 + block_q, Lq)
        qi = q5[..., i0:i1, :].to(work) * scale             # .to is a no-op (no copy) for float32/float64
        m = torch.full(qi.shape[:-1], _NEG_INF, dtype=work, device=q.device)
        l = torch.zeros_like(m)
        acc = torch.zeros(qi.shape[:-1] + (dv,), dtype=work, device=q.device)
        for j0 in range(0, Lk, block_k):
            j1 = min(j0 + block_k, Lk)
            if causal and j0 > i1 - 1:            # the whole tile is in the future of every row
                if stats is not None:
                    stats.tiles_skipped += 1
                continue
            s = qi @ k5[..., j0:j1, :].to(work).transpose(-2, -1)            # (B, Hkv, G, bq, bk): one tile
            if causal and j1 - 1 > i0:             # the tile crosses the diagonal
                rows = torch.arange(i0, i1, device=q.device).unsqueeze(-1)
                s = s.masked_fill(torch.arange(j0, j1, device=q.device) > rows, _NEG_INF)
            if pad5 is not None:
                s = s.masked_fill(~pad5[..., j0:j1], _NEG_INF)
            m, l, acc = _update(m, l, acc, s, v5[..., j0:j1, :].to(work), shared=True)
            if stats is not None:
                stats.tiles_computed += 1
        dead = l == 0
        out[..., i0:i1, :] = acc / torch.where(dead, torch.ones_like(l), l).unsqueeze(-1)
        lse[..., i0:i1] = torch.where(dead, torch.full_like(m, _NEG_INF), m + torch.log(torch.where(dead, torch.ones_like(l), l)))
    return out.view(B, H, Lq, dv), lse.view(B, H, Lq)


# ---------------------------------------------------------------- backward by recomputation
class FlashAttentionFunction(torch.autograd.Function):
    r"""Tiled attention whose backward recomputes the probabilities tile by tile.

    Forward: :func:`flash_attention_forward`; saved for backward: ``q, k, v``, the output
    :math:`O` and the log-sum-exp :math:`\lambda` per row (``seq_q`` numbers per head), never the
    ``seq_q x seq_k`` probabilities. Backward (FlashAttention-2's Algorithm 2, Dao 2023, which saves
    only the log-sum-exp, §3.1.1; FlashAttention's Algorithm 4, Dao et al. 2022, saves :math:`m` and
    :math:`\ell`; the row term :math:`D`, derived in FlashAttention's Appendix B.2, Eq. 4, and computed per
    tile there in Algorithm 4, line 19, is computed once before the loop, as FlashAttention-2's Algorithm 2,
    line 4, does): :math:`D_i = \sum_c dO_{ic} O_{ic}`, then for each tile

    .. math::
        P = e^{S - \lambda},\quad dV \mathrel{+}= P^\top dO,\quad dP = dO\,V^\top,\quad
        dS = P \circ (dP - D),\quad dQ \mathrel{+}= \text{scale}\cdot dS\,K,\quad dK \mathrel{+}= \text{scale}\cdot dS^\top Q .

    With grouped-query attention the K/V gradients are summed over the query heads that share a
    K/V head. Use through :func:`flash_attention`.
    """

    @staticmethod
    def forward(ctx, q, k, v, causal, key_padding_mask, scale, block_q, block_k):
        group, scale = _check_qkv(q, k, v, causal, key_padding_mask, scale)
        out, lse = _flash_forward(q, k, v, causal, key_padding_mask, scale, block_q, block_k, group, None)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.key_padding_mask = key_padding_mask
        ctx.causal, ctx.scale, ctx.block_q, ctx.block_k, ctx.group = causal, scale, block_q, block_k, group
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable  # lse is saved as an intermediate: a double backward would be wrong
    def backward(ctx, d_out):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _flash_backward(q, k, v, out, lse, d_out, ctx.causal, ctx.key_padding_mask, ctx.scale,
                                     ctx.block_q, ctx.block_k, ctx.group)
        return dq, dk, dv, None, None, None, None, None


def _flash_backward(q, k, v, out, lse, d_out, causal, key_padding_mask, scale, block_q, block_k, group):
    B, H, Lq, d = q.shape
    Lk = k.shape[2]
    work = _work_dtype(q.dtype)                  # float32 for bfloat16/float16 input, as in the forward
    in_dtype = q.dtype
    q, k, v, out, d_out = (t.to(work) for t in (q, k, v, out, d_out))
    q5, k5, v5 = _grouped(q, k, v, group)
    o5 = out.view(q5.shape[:-1] + (v.shape[-1],))
    do5 = d_out.contiguous().view(o5.shape)
    lse5 = lse.view(q5.shape[:-1])
    lse_safe = torch.where(torch.isneginf(lse5), torch.zeros_like(lse5), lse5)   # dead rows: P = exp(-inf) = 0
    D = (do5 * o5).sum(dim=-1)                                                   # (B, Hkv, G, Lq)
    pad5 = None if key_padding_mask is None else key_padding_mask[:, None, None, None, :]
    dq = torch.zeros_like(q5)
    dk = torch.zeros(k5.shape[:2] + (group,) + k5.shape[3:], dtype=k.dtype, device=k.device)
    dv = torch.zeros(v5.shape[:2] + (group,) + v5.shape[3:], dtype=v.dtype, device=v.device)
    for j0 in range(0, Lk, block_k):                     # key blocks outside (FlashAttention-2's backward order)
        j1 = min(j0 + block_k, Lk)
        kj, vj = k5[..., j0:j1, :], v5[..., j0:j1, :]
        for i0 in range(0, Lq, block_q):
            i1 = min(i0 + block_q, Lq)
            if causal and j0 > i1 - 1:
                continue
            s = (q5[..., i0:i1, :] * scale) @ kj.transpose(-2, -1)
            if causal and j1 - 1 > i0:
                rows = torch.arange(i0, i1, device=q.device).unsqueeze(-1)
                s = s.masked_fill(torch.arange(j0, j1, device=q.device) > rows, _NEG_INF)
            if pad5 is not None:
                s = s.masked_fill(~pad5[..., j0:j1], _NEG_INF)
            p = torch.exp(s - lse_safe[..., i0:i1].unsqueeze(-1))                 # recomputed, never stored
            do_i = do5[..., i0:i1, :]
            dv[..., j0:j1, :] += p.transpose(-2, -1) @ do_i
            dp = do_i @ vj.transpose(-2, -1)
            ds = p * (dp - D[..., i0:i1].unsqueeze(-1))
            dq[..., i0:i1, :] += scale * (ds @ kj)
            dk[..., j0:j1, :] += scale * (ds.transpose(-2, -1) @ q5[..., i0:i1, :])
    return dq.view(q.shape).to(in_dtype), dk.sum(dim=2).to(in_dtype), dv.sum(dim=2).to(in_dtype)


def flash_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
    key_padding_mask: Optional[torch.Tensor] = None, scale: Optional[float] = None,
    block_q: int = 64, block_k: int = 64,
) -> torch.Tensor:
    r"""Differentiable tiled attention (:class:`FlashAttentionFunction`): the output ``(batch, heads, seq_q, d_v)``.

    Same arguments as :func:`flash_attention_forward`; the gradients with respect to ``q``, ``k``
    and ``v`` are those of plain attention, computed by recomputation from the output and the
    log-sum-exp (``F.scaled_dot_product_attention``'s math, ``torch.autograd.gradcheck``-exact in float64).
    """
    _check_qkv(q, k, v, causal, key_padding_mask, scale)
    check_int(block_q, "block_q")
    check_int(block_k, "block_k")
    return FlashAttentionFunction.apply(q, k, v, causal, key_padding_mask, scale, block_q, block_k)


# --------------------------------------------------------------------------- decoding
def split_kv_decode(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, num_splits: int, *,
    key_padding_mask: Optional[torch.Tensor] = None, scale: Optional[float] = None,
    return_partials: bool = False,
):
    r"""One decoding step over a long KV cache split into ``num_splits`` chunks (flash-decoding's split of the keys).

    Each chunk of the cache is attended to on its own (:func:`flash_attention_forward`, in one
    tile), giving a partial output and its log-sum-exp; :func:`merge_attention_partials` combines
    them. On a GPU the chunks run in parallel (one query alone gives too little parallel work
    otherwise); here they run one after the other and the point is that the merge is exact.

    Args:
        q: ``(batch, heads, 1, d)``: one new query per head, which sees every cached key (no causal
            mask is needed). Several new queries at once (a chunked step whose keys are already in the
            cache) would need a causal mask among the new tokens and are refused: decode them one at a time.
        k_cache, v_cache: ``(batch, heads_kv, seq, d)`` (e.g. ``helpers.kvcache.KVCache`` contents).
        num_splits: number of chunks, ``1 <= num_splits <= seq`` (sizes differ by at most one).
        key_padding_mask: optional bool ``(batch, seq)``, True for a real cached token.
        return_partials: also return the lists of partial outputs and log-sum-exps.

    Returns:
        ``(out, lse)``, or ``(out, lse, outs, lses)`` with ``return_partials``.
    """
    group, scale = _check_qkv(q, k_cache, v_cache, False, key_padding_mask, scale)
    if q.shape[2] != 1:
        raise ValueError(f"q must hold one new query per head, shape (batch, heads, 1, d), got {tuple(q.shape)}: "
                         "split_kv_decode applies no causal mask, so with several new queries whose keys are already "
                         "in the cache each would see the later ones; decode them one at a time")
    seq = k_cache.shape[2]
    check_int(num_splits, "num_splits")
    if num_splits > seq:
        raise ValueError(f"num_splits must be <= the cache length {seq}, got {num_splits}")
    bounds = [round(i * seq / num_splits) for i in range(num_splits + 1)]
    outs, lses = [], []
    for a, b in zip(bounds[:-1], bounds[1:]):
        pad = None if key_padding_mask is None else key_padding_mask[:, a:b]
        o, s = _flash_forward(q, k_cache[:, :, a:b], v_cache[:, :, a:b], False, pad, scale,
                              q.shape[2], b - a, group, None)
        outs.append(o)
        lses.append(s)
    out, lse = merge_attention_partials(outs, lses)
    out = out.to(q.dtype)                          # the merge promotes to the (float32) lse dtype
    return (out, lse, outs, lses) if return_partials else (out, lse)


# ------------------------------------------------------------------------ exact counts
def score_matrix_bytes(batch: int, heads: int, seq_q: int, seq_k: int, dtype: torch.dtype = torch.float32) -> int:
    """Bytes of one materialised ``(batch, heads, seq_q, seq_k)`` score (or probability) matrix."""
    for n, name in ((batch, "batch"), (heads, "heads"), (seq_q, "seq_q"), (seq_k, "seq_k")):
        check_int(n, name)
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype, got {type(dtype).__name__}")
    return batch * heads * seq_q * seq_k * torch.empty((), dtype=dtype).element_size()


def tiled_working_bytes(batch: int, heads: int, block_q: int, block_k: int, head_dim: int,
                        dtype: torch.dtype = torch.float32) -> int:
    r"""Bytes of the tiled pass's per-row-block state: one score tile and its exponentials
    (:math:`2\,b_q b_k`), the accumulator and the scaled query block (:math:`2\,b_q d`) and
    :math:`m, \ell` (:math:`2\,b_q`), per head and batch item. A lower estimate of the extra memory
    (the output and the log-sum-exp, and short-lived temporaries, come on top)."""
    for n, name in ((batch, "batch"), (heads, "heads"), (block_q, "block_q"), (block_k, "block_k"), (head_dim, "head_dim")):
        check_int(n, name)
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype, got {type(dtype).__name__}")
    per = 2 * block_q * block_k + 2 * block_q * head_dim + 2 * block_q
    return batch * heads * per * torch.empty((), dtype=dtype).element_size()
