r"""Scaled dot-product attention and multi-head attention, written out from scratch.

Taught in ``notebooks/03_mha_from_scratch.ipynb``: the causal mask, the scaled
dot-product, splitting ``d_model`` into heads and merging them back, and the check
against ``torch.nn.MultiheadAttention`` / ``torch.nn.functional.scaled_dot_product_attention``.
Used again by notebook 04 (attention dropout), 05 (``head_mask``: pruning heads and
the head-importance scores of Michel et al. 2019), 06 (RoPE with shifted positions)
and 07 (``bias=False`` and ``rope_layout="half"``, as in Hugging Face Llama).

Paper: Vaswani et al., "Attention Is All You Need" (2017), section 3.2, eqs. (1)
and the multi-head formula

.. math::
    \operatorname{MultiHead}(Q, K, V) = \operatorname{Concat}(\text{head}_1, \dots,
    \text{head}_h) W^O, \qquad
    \text{head}_i = \operatorname{Attention}(Q W_i^Q, K W_i^K, V W_i^V).

Conventions used throughout the series
--------------------------------------
* **Boolean masks are True where attention is allowed**, the convention of
  ``torch.nn.functional.scaled_dot_product_attention``. ``torch.nn.MultiheadAttention``'s
  boolean ``attn_mask`` means the opposite (True = *not* allowed): pass ``~mask`` to it.
  A floating-point mask is *added* to the scores (0 = allowed, ``-inf`` = blocked) in
  both conventions.
* A query row whose keys are all masked (no True in a bool mask, only ``-inf`` in a float
  mask) gets all-zero weights and a zero output, never NaN; a finite float mask such as
  ``finfo(dtype).min`` is not recognised (see ``scaled_dot_product_attention``). This is what ``F.scaled_dot_product_attention`` does in torch >= 2.5
  ("safe softmax"); ``nn.MultiheadAttention`` returns NaN for such rows. Zeros keep a
  padded or empty row from poisoning a whole batch (NaN * 0 is NaN in the backward pass).
* Inputs are batch-first: ``(batch, seq, d_model)``; per-head tensors are
  ``(batch, heads, seq, head_dim)``.
"""
from __future__ import annotations

import math
from typing import Optional, Union

import torch
import torch.nn.functional as F
from torch import nn

from .rope import LAYOUTS, PositionsLike, apply_rope

__all__ = ["causal_mask", "scaled_dot_product_attention", "MultiHeadAttention"]


# --------------------------------------------------------------------------- checks
def _check_tensor(x, name: str, min_dim: int = 1) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() < min_dim:
        raise ValueError(f"{name} must have at least {min_dim} dimensions, got shape {tuple(x.shape)}")
    return x


def _check_dropout(p, name: str = "dropout") -> float:
    if isinstance(p, bool) or not isinstance(p, (int, float)):
        raise TypeError(f"{name} must be a float in [0, 1), got {type(p).__name__} ({p!r})")
    if not (0.0 <= p < 1.0):
        raise ValueError(f"{name} must be in [0, 1), got {p}")
    return float(p)


def _check_positive_int(n, name: str) -> int:
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"{name} must be an int, got {type(n).__name__} ({n!r})")
    if n < 1:
        raise ValueError(f"{name} must be >= 1, got {n}")
    return n


def _check_mask(mask, scores_shape: tuple) -> torch.Tensor:
    """``mask`` must be bool or floating and broadcast to ``scores_shape`` unchanged."""
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"mask must be a torch.Tensor (bool or float), got {type(mask).__name__}")
    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise TypeError(
            f"mask must be a bool tensor (True = allowed) or a float tensor added to the scores, "
            f"got dtype {mask.dtype}"
        )
    try:
        shape = torch.broadcast_shapes(tuple(mask.shape), tuple(scores_shape))
    except RuntimeError:
        shape = None
    if shape != tuple(scores_shape):
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} is not broadcastable to the attention scores of "
            f"shape (..., seq_q, seq_k) = {tuple(scores_shape)}"
        )
    return mask


# ----------------------------------------------------------------------------- mask
def causal_mask(seq_len: int, device: Union[None, str, torch.device] = None) -> torch.Tensor:
    r"""The causal (autoregressive) mask: query :math:`i` may attend to key :math:`j` iff :math:`j \le i`.

    .. math:: M_{ij} = [\, j \le i \,]

    Vaswani et al. (2017), sec. 3.2.3: masking "all values in the input of the softmax
    which correspond to illegal connections" prevents leftward information flow.

    Args:
        seq_len: number of positions, >= 1.
        device: where to create the mask.

    Returns:
        Bool tensor ``(seq_len, seq_len)``, **True where attention is allowed** (lower
        triangle and diagonal), the convention of ``F.scaled_dot_product_attention``.
        ``nn.MultiheadAttention``'s bool ``attn_mask`` means the opposite: give it ``~mask``.
    """
    if isinstance(seq_len, bool) or not isinstance(seq_len, int):
        raise TypeError(f"seq_len must be an int, got {type(seq_len).__name__} ({seq_len!r})")
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    return torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril()


# ------------------------------------------------------------ scaled dot-product
def scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: Optional[torch.Tensor] = None,
    dropout_p: float = 0.0,
    training: bool = False,
    scale: Optional[float] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Attention of Vaswani et al. (2017), eq. (1), written out: returns the output *and* the weights.

    .. math::
        S = \frac{Q K^\top}{\sqrt{d_k}} \;(+\,\text{mask}), \qquad
        A = \operatorname{softmax}_{\text{keys}}(S), \qquad
        \text{out} = \operatorname{Dropout}(A)\, V.

    A boolean ``mask`` sets the blocked scores to :math:`-\infty` before the softmax
    (True = allowed); a float mask is added to the scores. A query row whose keys are
    all blocked gets weights 0 and output 0 instead of NaN (the choice of
    ``F.scaled_dot_product_attention``; see the module docstring). "All blocked" means
    no True in a bool mask, or only ``-inf`` in a float mask: a finite float mask (such as
    ``torch.finfo(dtype).min``) is added as it is, in the scores' dtype, and its fully masked
    rows are not zeroed. With ``finfo(dtype).min`` such a row is uniform in float32, float64
    and bfloat16. In float16 the sum ``s + finfo.min`` lies on a grid of step 32 near -65504:
    a scaled score ``s <= -16`` overflows to ``-inf`` (weight 0), one ``>= 16`` rounds to
    -65472 or above and takes (to float16 precision) all the weight, so the row is uniform
    only while every ``s`` is in (-16, 16), and it is NaN, in the output and the gradient,
    when every ``s <= -16``
    (``F.scaled_dot_product_attention`` computes float16 in float32 on the CPU and returns
    the unmasked output there instead). Pass a bool mask to get zeros.

    Args:
        q: ``(..., seq_q, d_k)``.
        k: ``(..., seq_k, d_k)``.
        v: ``(..., seq_k, d_v)``. Leading dimensions must broadcast with ``q``'s.
        mask: ``None``, or a bool/float tensor broadcastable to ``(..., seq_q, seq_k)``.
        dropout_p: probability of dropping an attention weight (only when ``training``),
            in [0, 1). Kept weights are scaled by :math:`1/(1-p)`.
        training: apply dropout only if True.
        scale: the factor multiplying :math:`QK^\top`; default :math:`1/\sqrt{d_k}`.

    Returns:
        ``(output, weights)``: ``output`` ``(..., seq_q, d_v)``; ``weights``
        ``(..., seq_q, seq_k)``, the softmax probabilities *before* dropout (each row sums
        to 1, or to 0 for a fully masked row); ``nn.MultiheadAttention`` and Hugging Face's
        eager attention return them *after* dropout in training mode (notebook 07 §3).
    """
    _check_tensor(q, "q", 2)
    _check_tensor(k, "k", 2)
    _check_tensor(v, "v", 2)
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must have the same last dimension d_k, got q {tuple(q.shape)} and k {tuple(k.shape)}"
        )
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"k and v must have the same number of keys (dim -2), got k {tuple(k.shape)} and v {tuple(v.shape)}"
        )
    dropout_p = _check_dropout(dropout_p, "dropout_p")
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    # Scaling q (seq_q x d_k numbers) rather than the scores (seq_q x seq_k) is the same
    # product, cheaper, and what nn.MultiheadAttention does.
    scores = torch.matmul(q * scale, k.transpose(-2, -1))  # (..., seq_q, seq_k)
    dead = None  # rows with no allowed key
    if mask is not None:
        _check_mask(mask, scores.shape)
        # Rows with no allowed key, found on the (small, unbroadcast) mask itself.
        if mask.dtype == torch.bool:
            dead = ~mask.any(dim=-1, keepdim=True)
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            dead = torch.isneginf(mask).all(dim=-1, keepdim=True)
            scores = scores + mask.to(scores.dtype)
        # On the meta device there are no values to test: always take the zeroing branch
        # (same shapes, same result where no row is dead).
        if dead.device.type == "meta" or bool(dead.any()):
            # Replace the -inf of dead rows by 0 before the softmax so that neither the
            # forward nor the backward pass sees a NaN, then zero their weights.
            scores = scores.masked_fill(dead, 0.0)
        else:
            dead = None
    weights = torch.softmax(scores, dim=-1)
    if dead is not None:
        weights = weights.masked_fill(dead, 0.0)
    attn = F.dropout(weights, p=dropout_p, training=True) if (training and dropout_p > 0) else weights
    return torch.matmul(attn, v), weights


# ------------------------------------------------------------------ multi-head module
class MultiHeadAttention(nn.Module):
    r"""Multi-head attention (Vaswani et al. 2017, sec. 3.2.2), batch-first, from scratch.

    .. math::
        Q = X_q W^Q,\; K = X_k W^K,\; V = X_v W^V \quad(\text{each } d_\text{model}\times d_\text{model}),\\
        \text{split into } h \text{ heads of } d_k = d_\text{model}/h:\;
        (B, L, d_\text{model}) \to (B, L, h, d_k) \to (B, h, L, d_k),\\
        \text{head}_i = \operatorname{softmax}\!\Big(\frac{Q_i K_i^\top}{\sqrt{d_k}} + M\Big) V_i,\quad
        \text{out} = \operatorname{Concat}_i(m_i\,\text{head}_i)\, W^O

    with :math:`m_i` the optional ``head_mask`` (1 keeps head :math:`i`, 0 prunes it;
    Michel et al., "Are Sixteen Heads Really Better than One?", 2019).

    The four projections are ``linear_q``, ``linear_k``, ``linear_v`` and ``linear_out``,
    each ``nn.Linear(d_model, d_model)`` as in the study notes: one big matrix per role,
    whose output is then *viewed* as ``h`` heads (``view(B, L, h, d_k).transpose(1, 2)``).

    With ``rope=True`` the per-head queries and keys are rotated by RoPE
    (:func:`helpers.rope.apply_rope`, Su et al. 2021) after the split, with frequency base
    ``rope_base`` and pairing ``rope_layout`` (``"interleaved"`` as in the notes and
    RoFormer, ``"half"`` as in Hugging Face Llama). ``rope_base`` and ``rope_layout`` are
    plain attributes so later notebooks can change them (NTK scaling of the base), and
    fractional ``positions`` give position interpolation.

    Two computation paths, same numbers up to float rounding (one exception: a float16 module
    with a finite ``finfo(float16).min`` float mask and a fully masked row, whose output differs
    between the paths, as helpers' and torch's SDPA do there; notebook 03 §4a; a bool mask agrees):

    * **explicit** (:func:`scaled_dot_product_attention` above): used when
      ``need_weights=True``, when a ``head_mask`` is given, or when attention dropout is
      active (training with ``dropout > 0``); it returns the per-head weights.
    * **fused** (``torch.nn.functional.scaled_dot_product_attention``): used otherwise;
      it never materialises the weights in Python and is what the benchmark times
      against ``nn.MultiheadAttention``; ``weights`` is then ``None``.

    Args:
        d_model: model width, divisible by ``num_heads``.
        num_heads: number of heads :math:`h`.
        dropout: attention-weight dropout probability in [0, 1) (as ``nn.MultiheadAttention``).
        bias: whether the four projections have biases (Llama: False).
        rope: rotate Q and K per head with RoPE.
        rope_base: RoPE frequency base (10000 in RoFormer).
        rope_layout: ``"interleaved"`` (default) or ``"half"``.
        num_kv_heads: number of key/value heads (default ``num_heads``: plain multi-head
            attention). Fewer K/V heads than query heads is grouped-query attention
            (Ainslie et al. 2023, "GQA"); ``num_kv_heads=1`` is multi-query attention
            (Shazeer 2019, "Fast Transformer Decoding: One Write-Head is All You Need").
            ``linear_k`` and ``linear_v`` then output ``num_kv_heads * head_dim`` features
            and each K/V head serves ``num_heads // num_kv_heads`` consecutive query heads
            (:meth:`repeat_kv`, as ``repeat_kv`` in Hugging Face Llama). Must divide
            ``num_heads``. Taught in notebook 05.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        rope: bool = False,
        rope_base: float = 10000.0,
        rope_layout: str = "interleaved",
        num_kv_heads: Optional[int] = None,
    ) -> None:
        super().__init__()
        _check_positive_int(d_model, "d_model")
        _check_positive_int(num_heads, "num_heads")
        if num_kv_heads is None:
            num_kv_heads = num_heads
        _check_positive_int(num_kv_heads, "num_kv_heads")
        if num_heads % num_kv_heads != 0:
            raise ValueError(
                f"num_heads must be divisible by num_kv_heads (each K/V head serves a group of query heads), "
                f"got num_heads={num_heads}, num_kv_heads={num_kv_heads}"
            )
        if d_model % num_heads != 0:
            raise ValueError(
                f"d_model must be divisible by num_heads, got d_model={d_model}, num_heads={num_heads} "
                f"(d_model % num_heads = {d_model % num_heads})"
            )
        self.dropout = _check_dropout(dropout, "dropout")
        if rope_layout not in LAYOUTS:
            raise ValueError(f"rope_layout must be one of {LAYOUTS}, got {rope_layout!r}")
        if isinstance(rope_base, bool) or not isinstance(rope_base, (int, float)) or not (
            math.isfinite(rope_base) and rope_base > 0
        ):
            raise ValueError(f"rope_base must be a finite number > 0, got {rope_base!r}")
        self.d_model = d_model
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        if rope and self.head_dim % 2 != 0:
            raise ValueError(
                f"rope=True needs an even head_dim = d_model / num_heads, got {d_model} / {num_heads} = {self.head_dim}"
            )
        self.rope = bool(rope)
        self.rope_base = float(rope_base)
        self.rope_layout = rope_layout
        # Optional per-pair RoPE frequencies (head_dim // 2,) replacing rope_base ** (-2i/d), e.g.
        # helpers.rope.llama3_frequencies (set by helpers.hf.mha_from_llama). A persistent buffer, so it
        # travels in state_dict() and follows .to(device); _apply keeps its float32 when the module is
        # cast (.to(torch.bfloat16), .half()), so a cast cannot round it (notebook 07 §5). None (the
        # default, plain RoPE) is not in the state_dict.
        self.register_buffer("rope_inv_freq", None, persistent=True)
        self.linear_q = nn.Linear(d_model, d_model, bias=bias)
        self.num_kv_heads = num_kv_heads
        self.linear_k = nn.Linear(d_model, num_kv_heads * self.head_dim, bias=bias)
        self.linear_v = nn.Linear(d_model, num_kv_heads * self.head_dim, bias=bias)
        self.linear_out = nn.Linear(d_model, d_model, bias=bias)

    def extra_repr(self) -> str:
        s = f"d_model={self.d_model}, num_heads={self.num_heads}, head_dim={self.head_dim}, dropout={self.dropout}"
        if self.num_kv_heads != self.num_heads:
            s += f", num_kv_heads={self.num_kv_heads}"
        if self.rope:
            s += f", rope=True, rope_base={self.rope_base:g}, rope_layout={self.rope_layout!r}"
        return s

    # -- rope_inv_freq: a buffer that a dtype cast does not round ------------------------
    def _apply(self, fn, recurse: bool = True):
        """As ``nn.Module._apply``, but ``rope_inv_freq`` keeps its dtype (float32) under casts such as
        ``.to(torch.bfloat16)``, ``.half()`` or ``.bfloat16()``; it still follows device moves."""
        inv = self.rope_inv_freq
        super()._apply(fn, recurse)
        new = self.rope_inv_freq
        if inv is not None and new is not None and new.dtype != inv.dtype:
            self._buffers["rope_inv_freq"] = inv.to(device=new.device)
        return self

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        """Load ``rope_inv_freq`` too when the state_dict has it, also into a module built without it (its
        buffer is ``None`` until then); it is kept in float32 (or the float64 it was saved in)."""
        key = prefix + "rope_inv_freq"
        saved = state_dict.get(key)
        if isinstance(saved, torch.Tensor):
            if saved.shape != (self.head_dim // 2,):
                error_msgs.append(f"size mismatch for {key}: expected shape (head_dim // 2,) = ({self.head_dim // 2},), "
                                  f"got {tuple(saved.shape)}")
                state_dict = {k: v for k, v in state_dict.items() if k != key}
            else:
                dtype = saved.dtype if saved.dtype == torch.float64 else torch.float32
                self._buffers["rope_inv_freq"] = torch.empty(saved.shape, dtype=dtype, device=self.linear_q.weight.device)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    # -- the two reshapes of the notes --------------------------------------------
    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """``(batch, seq, d_model) -> (batch, heads, seq, head_dim)``: view, then transpose."""
        b, n, _ = x.shape
        return x.view(b, n, self.num_heads, self.head_dim).transpose(1, 2)

    def repeat_kv(self, x: torch.Tensor) -> torch.Tensor:
        """``(batch, num_kv_heads, seq, head_dim) -> (batch, num_heads, seq, head_dim)``: K/V head ``j``
        is repeated for query heads ``j*r .. j*r + r-1``, ``r = num_heads // num_kv_heads``
        (Hugging Face's ``repeat_kv``); the identity when ``num_kv_heads == num_heads``."""
        r = self.num_heads // self.num_kv_heads
        if r == 1:
            return x
        b, g, n, dk = x.shape
        return x[:, :, None].expand(b, g, r, n, dk).reshape(b, g * r, n, dk)

    def merge_heads(self, x: torch.Tensor) -> torch.Tensor:
        """``(batch, heads, seq, head_dim) -> (batch, seq, d_model)``: transpose back, then reshape."""
        b, _, n, _ = x.shape
        return x.transpose(1, 2).reshape(b, n, self.d_model)

    def _check_inputs(self, query, key, value):
        for name, t in (("query", query), ("key", key), ("value", value)):
            _check_tensor(t, name)
            if t.dim() != 3 or t.shape[-1] != self.d_model:
                raise ValueError(
                    f"{name} must have shape (batch, seq, d_model={self.d_model}), got {tuple(t.shape)}"
                )
        if key.shape[:2] != value.shape[:2]:
            raise ValueError(
                f"key and value must have the same (batch, seq), got key {tuple(key.shape)} and value {tuple(value.shape)}"
            )
        if query.shape[0] != key.shape[0]:
            raise ValueError(
                f"query and key must have the same batch size, got query {tuple(query.shape)} and key {tuple(key.shape)}"
            )

    def _head_mask(self, head_mask, batch: int, x: torch.Tensor) -> torch.Tensor:
        """``head_mask`` as ``(1 or batch, heads, 1, 1)`` in ``x``'s dtype (gradients kept)."""
        if not isinstance(head_mask, torch.Tensor):
            head_mask = torch.as_tensor(head_mask)
        h = self.num_heads
        if head_mask.shape == (h,):
            hm = head_mask.view(1, h, 1, 1)
        elif head_mask.dim() == 2 and head_mask.shape[1] == h and head_mask.shape[0] in (1, batch):
            hm = head_mask.view(head_mask.shape[0], h, 1, 1)
        else:
            raise ValueError(
                f"head_mask must have shape (num_heads,) = ({h},) or (batch, num_heads) = ({batch}, {h}), "
                f"got {tuple(head_mask.shape)}"
            )
        return hm.to(device=x.device, dtype=x.dtype)

    def forward(
        self,
        query: torch.Tensor,
        key: Optional[torch.Tensor] = None,
        value: Optional[torch.Tensor] = None,
        mask: Optional[torch.Tensor] = None,
        head_mask: Optional[torch.Tensor] = None,
        need_weights: bool = True,
        positions: PositionsLike = None,
        key_positions: PositionsLike = None,
        cache=None,
        layer_idx: int = 0,
    ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        r"""Attend from ``query`` to ``key``/``value`` (self-attention when they are omitted).

        Args:
            query: ``(batch, seq_q, d_model)``.
            key: ``(batch, seq_k, d_model)``; default ``query``.
            value: ``(batch, seq_k, d_model)``; default ``key``.
            mask: bool (True = allowed) or additive float, broadcastable to
                ``(batch, heads, seq_q, seq_k)``: e.g. ``causal_mask(seq)`` ``(seq_q, seq_k)``,
                a key-padding mask ``(batch, 1, 1, seq_k)``.
            head_mask: ``(num_heads,)`` or ``(batch, num_heads)`` multiplier of each head's
                output before the output projection; 0 prunes a head. A float tensor with
                ``requires_grad=True`` gives the head-importance gradients of Michel et al.
            need_weights: return the per-head weights (explicit path) or ``None`` (fused
                path when possible).
            positions: RoPE positions of the queries (only with ``rope=True``): ``(seq_q,)``
                or ``(batch, seq_q)``, ints or floats; default ``0 .. seq_q-1``.
            key_positions: RoPE positions of the keys; default ``positions`` when the keys are
                the queries' sequence (same length), else ``0 .. seq_k-1``.
            cache: a :class:`helpers.kvcache.KVCache` for decoding (self-attention only):
                the new tokens' keys and values (keys after RoPE) are appended to layer
                ``layer_idx`` of the cache and the queries attend causally to every cached key;
                ``positions`` then default to ``cache.seq_len(layer_idx) + 0 .. seq_q-1``
                (notebook 07 §6). Any object with ``seq_len(layer_idx)`` and ``update(layer_idx, key, value)``
                works (Hugging Face's ``cache.update`` contract); this module does not import the cache.
            layer_idx: the cache layer this module owns (with ``cache``).

        Returns:
            ``(output, weights)``: ``output`` ``(batch, seq_q, d_model)``; ``weights``
            ``(batch, heads, seq_q, seq_k)`` (before dropout; ``nn.MultiheadAttention`` and Hugging Face's
            eager path return them after) or ``None``.
        """
        if cache is not None:  # KV-cache decoding step (notebook 07 §6)
            if key is not None or value is not None or key_positions is not None:
                raise ValueError("with a cache, attention is self-attention over the cached tokens: "
                                 "key, value and key_positions must be None")
            return self._decode_step(query, cache, layer_idx, mask, head_mask, need_weights, positions)
        if key is None:
            key = query
        if value is None:
            value = key
        self._check_inputs(query, key, value)
        b, n_q, _ = query.shape
        n_k = key.shape[1]
        self._check_rope_args(positions, key_positions)
        mask = self._prepare_mask(mask, (b, self.num_heads, n_q, n_k), query.dtype)
        q, k, v = self._project(query, key, value)  # (b, h, n_q, d_k), (b, g, n_k, d_k) x 2
        if self.rope:
            if key_positions is None:
                key_positions = positions if n_k == n_q else None
            q = self._rotate(q, self._rope_positions(positions, n_q, "positions"))
            k = self._rotate(k, self._rope_positions(key_positions, n_k, "key_positions"))
        k, v = self.repeat_kv(k), self.repeat_kv(v)  # (b, h, n_k, d_k): each K/V head serves its group
        return self._attend(q, k, v, mask, head_mask, need_weights)

    # -- the pieces of forward -------------------------------------------------------------
    def _check_rope_args(self, positions, key_positions=None, names: str = "positions/key_positions") -> None:
        if not self.rope and (positions is not None or key_positions is not None):
            raise ValueError(f"{names} are only used with rope=True; this module has rope=False")

    @staticmethod
    def _prepare_mask(mask, scores_shape: tuple, dtype: torch.dtype):
        """Check ``mask`` against the scores' shape; a float mask is cast to the activations' dtype."""
        if mask is None:
            return None
        _check_mask(mask, scores_shape)
        return mask if mask.dtype == torch.bool else mask.to(dtype)

    def _project(self, query, key, value):
        """The three input projections, split into heads: ``q`` ``(b, h, n_q, d_k)``; ``k``, ``v``
        ``(b, g, n_k, d_k)`` with ``g = num_kv_heads`` (``g == h`` unless grouped-query attention)."""
        b, n_k = key.shape[:2]
        q = self.split_heads(self.linear_q(query))
        k = self.linear_k(key).view(b, n_k, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.linear_v(value).view(b, n_k, self.num_kv_heads, self.head_dim).transpose(1, 2)
        return q, k, v

    def _rotate(self, t: torch.Tensor, positions) -> torch.Tensor:
        """RoPE on per-head queries or keys ``(b, heads, n, d_k)`` with this module's base, layout and
        (if set) ``rope_inv_freq``; ``positions`` as returned by :meth:`_rope_positions`."""
        kw = {} if self.rope_inv_freq is None else {"frequencies": self.rope_inv_freq}
        return apply_rope(t, positions, base=self.rope_base, layout=self.rope_layout, **kw)

    def _decode_step(self, x, cache, layer_idx, mask, head_mask, need_weights, positions):
        r"""Causal self-attention of the new tokens ``x`` ``(b, n, d_model)`` over the cached ones and themselves.

        ``cache`` is any object with ``seq_len(layer_idx)`` (tokens cached so far, :math:`p`) and
        ``update(layer_idx, key, value)`` (append ``(b, g, n, d_k)`` keys/values, return all of them),
        e.g. :class:`helpers.kvcache.KVCache` (the contract of Hugging Face's ``cache.update``). The new
        tokens are rotated at positions :math:`p .. p+n-1` (unless ``positions`` are given) *before*
        their keys go into the cache, and new query :math:`i` sees keys :math:`0 .. p+i`.
        """
        if not (callable(getattr(cache, "update", None)) and callable(getattr(cache, "seq_len", None))):
            raise TypeError("cache must be a KV cache with update(layer_idx, key, value) and seq_len(layer_idx) "
                            f"(e.g. helpers.kvcache.KVCache), got {type(cache).__name__}")
        self._check_inputs(x, x, x)
        self._check_rope_args(positions, names="positions")
        b, n, _ = x.shape
        past = cache.seq_len(layer_idx)
        total = past + n
        q, k, v = self._project(x, x, x)
        if self.rope:
            if positions is None:
                positions = torch.arange(past, total, device=x.device)  # the new tokens' absolute positions
            else:
                positions = self._rope_positions(positions, n, "positions")
            q, k = self._rotate(q, positions), self._rotate(k, positions)
        k, v = cache.update(layer_idx, k, v)  # (b, g, past + n, d_k), keys already rotated
        k, v = self.repeat_kv(k), self.repeat_kv(v)
        if mask is None:
            mask = torch.ones(total, total, dtype=torch.bool, device=x.device).tril()[past:]  # (n, past + n)
        else:
            mask = self._prepare_mask(mask, (b, self.num_heads, n, total), q.dtype)
        return self._attend(q, k, v, mask, head_mask, need_weights)

    def _attend(self, q, k, v, mask, head_mask, need_weights):
        """Per-head ``q`` ``(b, h, n_q, d_k)`` against ``k, v`` ``(b, h, n_k, d_k)``, then merge heads and
        project: the explicit or the fused path (class docstring). Shared with the KV-cache step."""
        p = self.dropout if self.training else 0.0
        if need_weights or head_mask is not None or p > 0:
            out, weights = scaled_dot_product_attention(q, k, v, mask=mask, dropout_p=p, training=self.training)
            if head_mask is not None:
                out = out * self._head_mask(head_mask, q.shape[0], out)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            weights = None
        out = self.linear_out(self.merge_heads(out))
        return out, (weights if need_weights else None)

    @staticmethod
    def _rope_positions(positions, n: int, name: str):
        """``(seq,)`` or ``(batch, seq)`` positions -> broadcastable to ``(batch, heads, seq)``."""
        if positions is None:
            return None
        pos = positions if isinstance(positions, torch.Tensor) else torch.as_tensor(positions)
        if pos.dim() not in (1, 2) or pos.shape[-1] != n:
            raise ValueError(f"{name} must have shape (seq,) or (batch, seq) with seq = {n}, got {tuple(pos.shape)}")
        return pos if pos.dim() == 1 else pos[:, None, :]

    # -- interoperability ---------------------------------------------------------------
    @classmethod
    def from_torch(cls, module: nn.MultiheadAttention) -> "MultiHeadAttention":
        """A :class:`MultiHeadAttention` with the weights of ``module``, computing the same function.

        ``nn.MultiheadAttention`` stores Q, K and V as one ``in_proj_weight`` of shape
        ``(3 d_model, d_model)`` (rows ``[W^Q; W^K; W^V]``) and ``out_proj``. The result
        takes batch-first inputs; ``module(q, k, v, attn_mask=~mask,
        average_attn_weights=False)`` with ``batch_first=True`` gives the same output and
        weights (transpose ``(seq, batch, d)`` inputs if ``module.batch_first`` is False).

        Raises:
            TypeError: if ``module`` is not an ``nn.MultiheadAttention``.
            ValueError: for features with no counterpart here (``kdim``/``vdim`` different
                from ``embed_dim``, ``add_bias_kv``, ``add_zero_attn``).
        """
        if not isinstance(module, nn.MultiheadAttention):
            raise TypeError(f"module must be a torch.nn.MultiheadAttention, got {type(module).__name__}")
        if not module._qkv_same_embed_dim:
            raise ValueError(
                f"module must have kdim == vdim == embed_dim, got embed_dim={module.embed_dim}, "
                f"kdim={module.kdim}, vdim={module.vdim}"
            )
        if module.bias_k is not None or module.add_zero_attn:
            raise ValueError("module must not use add_bias_kv or add_zero_attn (no counterpart here)")
        bias = module.in_proj_bias is not None
        w = module.in_proj_weight
        new = cls(module.embed_dim, module.num_heads, dropout=module.dropout, bias=bias)
        new = new.to(device=w.device, dtype=w.dtype)
        d = module.embed_dim
        with torch.no_grad():
            for i, lin in enumerate((new.linear_q, new.linear_k, new.linear_v)):
                lin.weight.copy_(w[i * d : (i + 1) * d])
                if bias:
                    lin.bias.copy_(module.in_proj_bias[i * d : (i + 1) * d])
            new.linear_out.weight.copy_(module.out_proj.weight)
            if bias:
                new.linear_out.bias.copy_(module.out_proj.bias)
        new.train(module.training)
        return new
