r"""Scaled dot-product attention and multi-head attention, written out from scratch.

Taught in ``notebooks/03_mha_from_scratch.ipynb``: the causal mask, the scaled
dot-product, splitting ``d_model`` into heads and merging them back, and the check
against ``torch.nn.MultiheadAttention`` / ``torch.nn.functional.scaled_dot_product_attention``.
Later notebooks add features as arguments, each behind one branch: attention dropout (04),
``head_mask`` and grouped-query attention (05), RoPE positions (06), the KV-cache decoding step
(07 §6: ``forward`` hands it to :func:`helpers.kvcache.cached_attention`, which reuses the same
methods) and the float32 frequencies of Hugging Face Llama (07 §5: the ``rope_inv_freq`` buffer,
kept at the end of the class).

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
  ``finfo(dtype).min`` is not recognised (see ``scaled_dot_product_attention``). This is what
  ``F.scaled_dot_product_attention`` does in torch >= 2.5 ("safe softmax");
  ``nn.MultiheadAttention`` returns NaN or 0 depending on the code path it takes (notebook
  03 §4a). Zeros keep a padded or empty row from
  poisoning a whole batch (NaN * 0 is NaN in the backward pass).
* Inputs are batch-first: ``(batch, seq, d_model)``; per-head tensors are
  ``(batch, heads, seq, head_dim)``.
* Arguments are checked once, at the public entry point (``forward``,
  :func:`scaled_dot_product_attention`); the code after the checks only computes.
"""
from __future__ import annotations

import math
from typing import Optional, Union

import torch
import torch.nn.functional as F
from torch import nn

from .kvcache import cached_attention
from .rope import LAYOUTS, PositionsLike, apply_rope
from .validate import check_choice, check_fraction, check_int, check_number, check_tensor

__all__ = ["causal_mask", "scaled_dot_product_attention", "MultiHeadAttention"]


# ----------------------------------------------------------------------------- mask
def causal_mask(seq_len: int, device: Union[None, str, torch.device] = None) -> torch.Tensor:
    r"""The causal (autoregressive) mask: query :math:`i` may attend to key :math:`j` iff :math:`j \le i`.

    .. math:: M_{ij} = [\, j \le i \,]

    Vaswani et al. (2017), sec. 3.2.3: masking "all values in the input of the softmax
    which correspond to illegal connections" prevents leftward information flow.

    Returns:
        Bool tensor ``(seq_len, seq_len)``, **True where attention is allowed** (lower
        triangle and diagonal), the convention of ``F.scaled_dot_product_attention``.
        ``nn.MultiheadAttention``'s bool ``attn_mask`` means the opposite: give it ``~mask``.
    """
    check_int(seq_len, "seq_len")
    return torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril()


def _check_mask(mask, shape: tuple) -> None:
    """``mask`` is bool or floating and broadcasts to the scores' ``shape`` without enlarging it."""
    if check_tensor(mask, "mask").dtype != torch.bool and not mask.is_floating_point():
        raise TypeError(f"mask must be a bool tensor (True = allowed) or a float tensor added to the scores, "
                        f"got dtype {mask.dtype}")
    if mask.dim() > len(shape) or any(m not in (1, s) for m, s in zip(mask.shape[::-1], shape[::-1])):
        raise ValueError(f"mask of shape {tuple(mask.shape)} is not broadcastable to the attention scores of "
                         f"shape (..., seq_q, seq_k) = {tuple(shape)}")


# ------------------------------------------------------------ scaled dot-product
def _attention_weights(q: torch.Tensor, k: torch.Tensor, mask=None, scale: Optional[float] = None) -> torch.Tensor:
    r""":math:`\operatorname{softmax}(q k^\top / \sqrt{d_k} + M)` over the keys; a row with no allowed key is 0."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = torch.matmul(q * scale, k.transpose(-2, -1))  # (..., seq_q, seq_k); scaling q: fewer numbers if seq_k > d_k
    if mask is None:
        return torch.softmax(scores, dim=-1)
    if mask.dtype == torch.bool:  # True = allowed
        dead = ~mask.any(dim=-1, keepdim=True)  # (..., seq_q, 1): rows with no allowed key
        scores = scores.masked_fill(~mask, float("-inf"))
    else:  # added to the scores: 0 = allowed, -inf = blocked
        dead = torch.isneginf(mask).all(dim=-1, keepdim=True)
        scores = scores + mask.to(scores.dtype)
    # A dead row is all -inf and its softmax NaN: give it scores 0 (no NaN forward or backward), then weights 0.
    return torch.softmax(scores.masked_fill(dead, 0.0), dim=-1).masked_fill(dead, 0.0)


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
    ``torch.finfo(dtype).min``) is added as it is and its fully masked rows are not zeroed
    (what they become, per dtype: notebook 03 §4a). Pass a bool mask to get zeros.

    Args:
        q: ``(..., seq_q, d_k)``.
        k: ``(..., seq_k, d_k)``.
        v: ``(..., seq_k, d_v)``. Leading dimensions must broadcast with ``q``'s.
        mask: ``None``, or a bool/float tensor broadcastable to ``(..., seq_q, seq_k)``.
        dropout_p: probability of dropping an attention weight (only when ``training``),
            in [0, 1). Kept weights are scaled by :math:`1/(1-p)`.
        training: apply dropout only if True.
        scale: the factor multiplying :math:`QK^\top`, a finite number > 0; default :math:`1/\sqrt{d_k}`.

    Returns:
        ``(output, weights)``: ``output`` ``(..., seq_q, d_v)``; ``weights``
        ``(..., seq_q, seq_k)``, the softmax probabilities *before* dropout (each row sums
        to 1, or to 0 for a fully masked row); ``nn.MultiheadAttention`` and Hugging Face's
        eager attention return them *after* dropout in training mode (notebook 07 §3).
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(t, name, min_dim=2)
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must have the same last dimension d_k, got q {tuple(q.shape)} and k "
                         f"{tuple(k.shape)}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same number of keys (dim -2), got k {tuple(k.shape)} and v "
                         f"{tuple(v.shape)}")
    dropout_p = check_fraction(dropout_p, "dropout_p")
    scale = None if scale is None else check_number(scale, "scale")
    if mask is not None:
        _check_mask(mask, (*torch.broadcast_shapes(q.shape[:-2], k.shape[:-2]), q.shape[-2], k.shape[-2]))
    weights = _attention_weights(q, k, mask, scale)  # (..., seq_q, seq_k)
    attn = F.dropout(weights, p=dropout_p, training=True) if (training and dropout_p > 0) else weights
    return torch.matmul(attn, v), weights


# ------------------------------------------------------------------ multi-head module
class MultiHeadAttention(nn.Module):
    r"""Multi-head attention (Vaswani et al. 2017, sec. 3.2.2), batch-first, from scratch.

    .. math::
        Q = X_q W^Q,\; K = X_k W^K,\; V = X_v W^V,\quad
        (B, L, d_\text{model}) \to (B, L, h, d_k) \to (B, h, L, d_k),\\
        \text{head}_i = \operatorname{softmax}\!\Big(\frac{Q_i K_i^\top}{\sqrt{d_k}} + M\Big) V_i,\quad
        \text{out} = \operatorname{Concat}_i(m_i\,\text{head}_i)\, W^O

    with :math:`m_i` the optional ``head_mask`` (1 keeps head :math:`i`, 0 prunes it;
    Michel et al., "Are Sixteen Heads Really Better than One?", 2019). The four projections
    ``linear_q``, ``linear_k``, ``linear_v``, ``linear_out`` are one ``nn.Linear`` per role, as in
    the study notes, whose output is *viewed* as heads (:meth:`split_heads`).

    The pieces of ``forward`` are methods that the KV-cache step
    (:func:`helpers.kvcache.cached_attention`) composes too: :meth:`split_heads`, :meth:`rotate`
    (RoPE), :meth:`attend` (grouped K/V heads, the weights, ``head_mask``, the output projection)
    and :meth:`check_inputs`.

    :meth:`attend` has two computation paths, the same numbers up to float rounding (one
    exception: a float16 module with a finite ``finfo(float16).min`` float mask and a fully
    masked row, notebook 03 §4a; a bool mask agrees):

    * **explicit** (the weights of :func:`scaled_dot_product_attention`): when
      ``need_weights=True``, when a ``head_mask`` is given, or when attention dropout is
      active (training with ``dropout > 0``); it returns the per-head weights.
    * **fused** (``torch.nn.functional.scaled_dot_product_attention``): otherwise; the weights
      are never materialised in Python and ``weights`` is ``None``.

    Args:
        d_model: model width, divisible by ``num_heads``.
        num_heads: number of heads :math:`h`.
        dropout: attention-weight dropout probability in [0, 1) (as ``nn.MultiheadAttention``).
        bias: whether the four projections have biases (Llama: False).
        rope: rotate Q and K per head with RoPE (:func:`helpers.rope.apply_rope`, Su et al. 2021),
            base ``rope_base``, pairing ``rope_layout`` (``"interleaved"`` as in the notes and RoFormer,
            ``"half"`` as in Hugging Face Llama). Both are plain attributes, so later notebooks can
            change them (NTK scaling of the base); fractional ``positions`` give position interpolation.
        rope_base: RoPE frequency base (10000 in RoFormer).
        rope_layout: ``"interleaved"`` (default) or ``"half"``.
        num_kv_heads: number of key/value heads (default ``num_heads``: plain multi-head
            attention). Fewer is grouped-query attention (Ainslie et al. 2023, "GQA"), 1 is
            multi-query attention (Shazeer 2019). ``linear_k``, ``linear_v`` then output
            ``num_kv_heads * head_dim`` features and each K/V head serves ``num_heads // num_kv_heads``
            consecutive query heads (:meth:`repeat_kv`). Must divide ``num_heads``. Notebook 05.
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
        check_int(d_model, "d_model")
        check_int(num_heads, "num_heads")
        num_kv_heads = check_int(num_heads if num_kv_heads is None else num_kv_heads, "num_kv_heads")
        if num_heads % num_kv_heads != 0:
            raise ValueError(f"num_heads must be divisible by num_kv_heads (each K/V head serves a group of query "
                             f"heads), got num_heads={num_heads}, num_kv_heads={num_kv_heads}")
        if d_model % num_heads != 0:
            raise ValueError(f"d_model must be divisible by num_heads, got d_model={d_model}, num_heads={num_heads} "
                             f"(d_model % num_heads = {d_model % num_heads})")
        if rope and (d_model // num_heads) % 2 != 0:
            raise ValueError(f"rope=True needs an even head_dim = d_model / num_heads, got {d_model} / {num_heads} "
                             f"= {d_model // num_heads}")
        self.dropout = check_fraction(dropout, "dropout")
        self.rope_layout = check_choice(rope_layout, "rope_layout", LAYOUTS)
        self.rope_base = check_number(rope_base, "rope_base")
        self.rope = bool(rope)
        self.d_model, self.num_heads, self.num_kv_heads = d_model, num_heads, num_kv_heads
        self.head_dim = d_model // num_heads  # d_k
        self.register_buffer("rope_inv_freq", None, persistent=True)  # float32 frequencies (07 §5), see _apply
        self.linear_q = nn.Linear(d_model, d_model, bias=bias)
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
            query, key, value: ``(batch, seq_q, d_model)``, ``(batch, seq_k, d_model)`` x 2; ``key``
                defaults to ``query``, ``value`` to ``key``.
            mask: bool (True = allowed) or additive float, broadcastable to ``(batch, heads, seq_q, seq_k)``:
                e.g. ``causal_mask(seq)``, a key-padding mask ``(batch, 1, 1, seq_k)``.
            head_mask: (notebook 05) ``(num_heads,)`` or ``(batch, num_heads)`` multiplier of each head's output before
                ``linear_out``; 0 prunes a head, a float tensor with ``requires_grad=True`` gives the
                head-importance gradients of Michel et al.
            need_weights: return the per-head weights (explicit path) or ``None`` (fused path when possible).
            positions, key_positions: RoPE positions (``rope=True`` only), ``(seq,)`` or ``(batch, seq)``,
                ints or floats; default ``0 .. seq-1``; ``key_positions`` defaults to ``positions`` when the
                keys are the queries' sequence (same length).
            cache, layer_idx: decode with a KV cache (:func:`helpers.kvcache.cached_attention`, notebook 07 §6):
                self-attention of the new tokens ``query`` over layer ``layer_idx`` of ``cache`` and themselves.

        Returns:
            ``(output, weights)``: ``output`` ``(batch, seq_q, d_model)``; ``weights``
            ``(batch, heads, seq_q, seq_k)`` (before dropout; ``nn.MultiheadAttention`` and Hugging Face's
            eager path return them after) or ``None``.
        """
        if cache is not None:  # one KV-cache decoding step (notebook 07 §6)
            if key is not None or value is not None or key_positions is not None:
                raise ValueError("with a cache, attention is self-attention over the cached tokens: "
                                 "key, value and key_positions must be None")
            return cached_attention(self, query, cache, layer_idx, mask, head_mask, need_weights, positions)
        key = query if key is None else key
        value = key if value is None else value
        mask = self.check_inputs(query, key, value, mask, positions, key_positions, head_mask=head_mask)
        q = self.split_heads(self.linear_q(query))  # (b, h, seq_q, d_k)
        k = self.split_heads(self.linear_k(key))  # (b, g, seq_k, d_k), g = num_kv_heads
        v = self.split_heads(self.linear_v(value))  # (b, g, seq_k, d_k)
        if self.rope:  # rotate q and k by their positions: scores depend on n - m only
            same = key_positions is None and k.shape[2] == q.shape[2]
            q, k = self.rotate(q, positions), self.rotate(k, positions if same else key_positions)
        return self.attend(q, k, v, mask, head_mask, need_weights)

    # -- the pieces of forward ------------------------------------------------------------
    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """``(batch, seq, heads * head_dim) -> (batch, heads, seq, head_dim)``: view, then transpose. The ``-1``
        is the heads: ``num_heads`` for q, ``num_kv_heads`` for k and v."""
        return x.view(x.shape[0], x.shape[1], -1, self.head_dim).transpose(1, 2)

    def merge_heads(self, x: torch.Tensor) -> torch.Tensor:
        """``(batch, heads, seq, head_dim) -> (batch, seq, heads * head_dim)``: transpose back, then ``flatten(2)`` (a reshape: it
        copies the transposed view)."""
        return x.transpose(1, 2).flatten(2)

    def repeat_kv(self, x: torch.Tensor) -> torch.Tensor:
        """``(batch, num_kv_heads, seq, head_dim) -> (batch, num_heads, seq, head_dim)``: K/V head ``j`` serves
        query heads ``j*r .. j*r + r-1``, ``r = num_heads // num_kv_heads`` (Hugging Face's ``repeat_kv``)."""
        r = self.num_heads // self.num_kv_heads
        return x if r == 1 else x[:, :, None].expand(-1, -1, r, -1, -1).flatten(1, 2)

    def rotate(self, x: torch.Tensor, positions: PositionsLike = None) -> torch.Tensor:
        """RoPE on per-head queries or keys ``(batch, heads, seq, head_dim)`` with this module's base, layout
        and ``rope_inv_freq``; ``(batch, seq)`` positions give example ``b`` row ``b`` in every head."""
        pos = None if positions is None else torch.as_tensor(positions)
        if pos is not None and pos.dim() == 2:
            pos = pos[:, None, :]  # (batch, 1, seq): broadcast over the heads
        return apply_rope(x, pos, base=self.rope_base, layout=self.rope_layout, frequencies=self.rope_inv_freq)

    def attend(self, q, k, v, mask=None, head_mask=None, need_weights: bool = True):
        """Per-head ``q`` ``(b, h, seq_q, d_k)`` against ``k, v`` ``(b, g, seq_k, d_k)``, heads merged and projected:
        ``(output (b, seq_q, d_model), weights (b, h, seq_q, seq_k) or None)``. Arguments as checked by forward."""
        if self.num_kv_heads != self.num_heads:  # grouped-query attention: each K/V head serves h/g query heads
            k, v = self.repeat_kv(k), self.repeat_kv(v)  # (b, h, seq_k, d_k)
        p = self.dropout if self.training else 0.0
        if need_weights or head_mask is not None or p > 0:  # explicit: softmax(q k^T / sqrt(d_k) + M) v
            weights = _attention_weights(q, k, mask)  # (b, h, seq_q, seq_k)
            attn = F.dropout(weights, p=p, training=True) if p > 0 else weights  # dropout on the weights (04)
            out = torch.matmul(attn, v)  # (b, h, seq_q, d_k)
        else:  # fused kernel, the same function
            out, weights = F.scaled_dot_product_attention(q, k, v, attn_mask=mask), None
        if head_mask is not None:  # m_i head_i (notebook 05): (h,) or (batch, h) as (1 or batch, h, 1, 1)
            out = out * torch.as_tensor(head_mask).view(-1, self.num_heads, 1, 1).to(device=out.device, dtype=out.dtype)
        return self.linear_out(self.merge_heads(out)), (weights if need_weights else None)

    # -- argument checks, once per call ---------------------------------------------------
    def check_inputs(self, query, key, value, mask=None, positions=None, key_positions=None, past: int = 0,
                     head_mask=None):
        """Check ``forward``'s arguments (``past``: keys already cached, for the decoding step); return the mask
        in the activations' dtype."""
        for name, t in (("query", query), ("key", key), ("value", value)):
            if check_tensor(t, name).dim() != 3 or t.shape[-1] != self.d_model:
                raise ValueError(f"{name} must have shape (batch, seq, d_model={self.d_model}), got {tuple(t.shape)}")
        if key.shape[:2] != value.shape[:2] or key.shape[0] != query.shape[0]:
            raise ValueError(f"key and value must have the same (batch, seq), and query the same batch size, got "
                             f"query {tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}")
        if positions is not None or key_positions is not None or head_mask is not None:
            self._check_options(positions, key_positions, head_mask, query.shape[:2], key.shape[1])
        if mask is None:
            return None
        _check_mask(mask, (query.shape[0], self.num_heads, query.shape[1], past + key.shape[1]))
        return mask if mask.dtype == torch.bool else mask.to(query.dtype)

    def _check_options(self, positions, key_positions, head_mask, batch_seq_q: tuple, n_k: int) -> None:
        """The RoPE positions (``rope=True`` only) and ``head_mask`` ``(h,)`` or ``(batch, h)`` (notebook 05)."""
        b, h = batch_seq_q[0], self.num_heads
        hm = None if head_mask is None else torch.as_tensor(head_mask)
        if hm is not None and hm.shape != (h,) and not (hm.dim() == 2 and hm.shape[1] == h and hm.shape[0] in (1, b)):
            raise ValueError(f"head_mask must have shape (num_heads,) = ({h},) or (batch, num_heads) = ({b}, {h}), "
                             f"got {tuple(hm.shape)}")
        if positions is None and key_positions is None:
            return
        if not self.rope:
            raise ValueError("positions/key_positions are only used with rope=True; this module has rope=False")
        for name, pos, n in (("positions", positions, batch_seq_q[1]), ("key_positions", key_positions, n_k)):
            shape = None if pos is None else tuple(torch.as_tensor(pos).shape)
            if shape is not None and (len(shape) not in (1, 2) or shape[-1] != n):
                raise ValueError(f"{name} must have shape (seq,) or (batch, seq) with seq = {n}, got {shape}")

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
            raise ValueError(f"module must have kdim == vdim == embed_dim, got embed_dim={module.embed_dim}, "
                             f"kdim={module.kdim}, vdim={module.vdim}")
        if module.bias_k is not None or module.add_zero_attn:
            raise ValueError("module must not use add_bias_kv or add_zero_attn (no counterpart here)")
        bias = module.in_proj_bias is not None
        w, d = module.in_proj_weight, module.embed_dim
        new = cls(d, module.num_heads, dropout=module.dropout, bias=bias).to(device=w.device, dtype=w.dtype)
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

    # -- float32 RoPE frequencies (notebook 07 §5; skip until then) ---------------------------
    # The optional buffer ``rope_inv_freq``: per-pair RoPE frequencies ``(head_dim // 2,)`` that replace
    # ``rope_base ** (-2i/d)`` (e.g. helpers.rope.llama3_frequencies, set by helpers.hf.mha_from_llama).
    # A persistent buffer, so it travels in ``state_dict()`` and follows ``.to(device)``. Unlike other
    # buffers it keeps its float32 under dtype casts (``.to(torch.bfloat16)``, ``.half()``), so a cast
    # cannot round it, and ``load_state_dict`` loads it also into a module built without it. ``None``
    # (plain RoPE, the default) is not in the state_dict.
    def _apply(self, fn, recurse: bool = True):
        inv = self.rope_inv_freq
        super()._apply(fn, recurse)
        new = self.rope_inv_freq
        if inv is not None and new is not None and new.dtype != inv.dtype:
            self._buffers["rope_inv_freq"] = inv.to(device=new.device)  # follow the device, keep the dtype
        return self

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        key = prefix + "rope_inv_freq"
        saved = state_dict.get(key)
        if isinstance(saved, torch.Tensor):
            if saved.shape != (self.head_dim // 2,):
                error_msgs.append(f"size mismatch for {key}: expected shape (head_dim // 2,) = "
                                  f"({self.head_dim // 2},), got {tuple(saved.shape)}")
                state_dict = {k: v for k, v in state_dict.items() if k != key}
            else:  # make room for it (the buffer may be None), in float32 (or the float64 it was saved in)
                dtype = saved.dtype if saved.dtype == torch.float64 else torch.float32
                device = self.linear_q.weight.device
                self._buffers["rope_inv_freq"] = torch.empty(saved.shape, dtype=dtype, device=device)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
