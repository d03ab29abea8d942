r"""Key/value cache for autoregressive decoding (taught in ``notebooks/07_from_scratch_to_huggingface.ipynb`` §6).

A causal decoder generating token :math:`t` needs the keys and values of tokens
:math:`0 .. t`; those of tokens :math:`0 .. t-1` did not change since the last step (the mask
keeps every earlier row blind to later tokens), so they are **kept, not recomputed**: each
step projects only the new token(s), appends their keys and values to the cache and lets the
new queries attend to all cached keys.

With RoPE the cache has two rules, and breaking either is a classic bug:

* the new token is rotated at its absolute position, :math:`m = ` (number of cached tokens),
  not at 0 (it is the only row of its input, but not the first token of the sequence);
* keys are cached **already rotated** (as Hugging Face's ``cache.update`` after
  ``apply_rotary_pos_emb``); rotating them again at the next step would rotate them twice.

Size: per layer and token the cache holds a key and a value for each K/V head,
:math:`2 \cdot g \cdot d_k` numbers, so

.. math:: \text{bytes} = 2 \cdot N \cdot g \cdot d_k \cdot n \cdot b \cdot \text{sizeof(dtype)}

for :math:`N` layers, :math:`g` K/V heads, sequence length :math:`n`, batch :math:`b`: grouped-query
attention (Ainslie et al. 2023) divides it by :math:`h/g`, multi-query attention (Shazeer 2019,
"Fast Transformer Decoding: One Write-Head is All You Need", where the cache's memory traffic is
the motivation) by :math:`h`.

* :class:`KVCache` -- the per-layer store (like ``transformers``' ``DynamicCache``).
* :func:`kv_cache_bytes` -- the formula above.
* :func:`cached_attention` -- one decoding step of a :class:`~helpers.attention.MultiHeadAttention`
  (what ``MultiHeadAttention.forward(x, cache=..., layer_idx=...)`` runs).
* :func:`greedy_generate` -- greedy decoding with or without the cache
  (what ``TinyTransformer.generate`` runs).
"""
from __future__ import annotations

from typing import Optional

import torch

from .validate import check_int

__all__ = ["KVCache", "kv_cache_bytes", "cached_attention", "greedy_generate"]


class KVCache:
    r"""The keys and values of every token seen so far, one pair of tensors per layer.

    ``keys[l]`` and ``values[l]`` have shape ``(batch, num_kv_heads, seq, head_dim)``; keys are
    stored **after** RoPE. :meth:`update` appends the new tokens' keys and values along ``seq``
    and returns the whole of them (the same return contract as ``cache.update`` in Hugging Face's
    ``LlamaAttention.forward``, whose arguments come in another order).

    Args:
        num_layers: number of attention layers that will share this cache (>= 1).
        max_len: if given, the most tokens the cache may hold; an :meth:`update` beyond it
            raises ``ValueError`` (a preallocated cache, like HF's ``StaticCache``, has such a size).
    """

    def __init__(self, num_layers: int, max_len: Optional[int] = None) -> None:
        self.num_layers = check_int(num_layers, "num_layers")
        self.max_len = None if max_len is None else check_int(max_len, "max_len")
        self.keys: list[Optional[torch.Tensor]] = [None] * num_layers
        self.values: list[Optional[torch.Tensor]] = [None] * num_layers

    def __repr__(self) -> str:
        return (f"KVCache(num_layers={self.num_layers}, seq_len={self.seq_len()}, max_len={self.max_len}, "
                f"nbytes={self.nbytes()})")

    def _check_layer(self, layer_idx) -> int:
        if isinstance(layer_idx, bool) or not isinstance(layer_idx, int):
            raise TypeError(f"layer_idx must be an int, got {type(layer_idx).__name__} ({layer_idx!r})")
        if not 0 <= layer_idx < self.num_layers:
            raise ValueError(f"layer_idx must be in [0, num_layers={self.num_layers}), got {layer_idx}")
        return layer_idx

    def seq_len(self, layer_idx: int = 0) -> int:
        """Number of tokens cached in layer ``layer_idx`` (0 before the first update): the
        position of the next token."""
        k = self.keys[self._check_layer(layer_idx)]
        return 0 if k is None else k.shape[-2]

    def update(self, layer_idx: int, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``key``, ``value`` ``(batch, num_kv_heads, new, head_dim)`` to layer ``layer_idx``.

        Returns:
            ``(keys, values)`` of all cached tokens, ``(batch, num_kv_heads, seq_len + new, head_dim)``.
        """
        self._check_layer(layer_idx)
        for name, t in (("key", key), ("value", value)):
            if not isinstance(t, torch.Tensor) or t.dim() != 4:
                raise ValueError(
                    f"{name} must be a (batch, num_kv_heads, seq, head_dim) tensor, got "
                    f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}"
                )
        if key.shape[:3] != value.shape[:3]:
            raise ValueError(f"key and value must agree on (batch, num_kv_heads, seq), got {tuple(key.shape)} and "
                             f"{tuple(value.shape)}")
        old_k, old_v = self.keys[layer_idx], self.values[layer_idx]
        if old_k is not None:
            if (key.shape[:2], key.shape[-1], value.shape[-1]) != (old_k.shape[:2], old_k.shape[-1], old_v.shape[-1]):
                raise ValueError(
                    f"new keys/values must match the cached (batch, num_kv_heads, ..., head_dim) = "
                    f"{tuple(old_k.shape[:2])} + {old_k.shape[-1]}, got key {tuple(key.shape)}, "
                    f"value {tuple(value.shape)}"
                )
            if key.dtype != old_k.dtype or key.device != old_k.device:
                raise ValueError(f"new keys must have the cache's dtype and device ({old_k.dtype}, {old_k.device}), "
                                 f"got ({key.dtype}, {key.device})")
            if value.dtype != old_v.dtype or value.device != old_v.device:  # else torch.cat silently promotes
                raise ValueError(f"new values must have the cache's dtype and device ({old_v.dtype}, {old_v.device}), "
                                 f"got ({value.dtype}, {value.device})")
        total = (0 if old_k is None else old_k.shape[-2]) + key.shape[-2]
        if self.max_len is not None and total > self.max_len:
            raise ValueError(f"the cache holds at most max_len={self.max_len} tokens; this update would make {total}")
        if old_k is None:
            self.keys[layer_idx], self.values[layer_idx] = key, value
        else:
            self.keys[layer_idx] = torch.cat([old_k, key], dim=-2)
            self.values[layer_idx] = torch.cat([old_v, value], dim=-2)
        return self.keys[layer_idx], self.values[layer_idx]

    def nbytes(self) -> int:
        """Bytes held by the cached keys and values (all layers)."""
        return sum(t.numel() * t.element_size() for t in self.keys + self.values if t is not None)


def kv_cache_bytes(
    num_layers: int, num_kv_heads: int, head_dim: int, seq_len: int, batch: int = 1, dtype: torch.dtype = torch.float32
) -> int:
    r"""Size of a full KV cache: :math:`2 \cdot N \cdot g \cdot d_k \cdot n \cdot b \cdot \text{sizeof(dtype)}` bytes.

    Args:
        num_layers, num_kv_heads, head_dim, seq_len, batch: :math:`N, g, d_k, n, b` (ints; seq_len >= 0, others >= 1).
        dtype: the cache dtype (float32 4 bytes, bfloat16/float16 2).
    """
    for name, v, lo in (("num_layers", num_layers, 1), ("num_kv_heads", num_kv_heads, 1), ("head_dim", head_dim, 1),
                        ("seq_len", seq_len, 0), ("batch", batch, 1)):
        check_int(v, name, lo)
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype, got {type(dtype).__name__} ({dtype!r})")
    return 2 * num_layers * num_kv_heads * head_dim * seq_len * batch * torch.empty((), dtype=dtype).element_size()


def cached_attention(mha, x: torch.Tensor, cache, layer_idx: int = 0, mask: Optional[torch.Tensor] = None,
                     head_mask: Optional[torch.Tensor] = None, need_weights: bool = True, positions=None):
    r"""Causal self-attention of the new tokens ``x`` over the cached ones and themselves: one decoding step.

    With :math:`p` = ``cache.seq_len(layer_idx)`` tokens cached and :math:`n` new ones:

    .. math::
        q, k, v = x W^Q, x W^K, x W^V;\quad
        q \leftarrow R_{p..p+n-1}\, q,\; k \leftarrow R_{p..p+n-1}\, k;\quad
        K = [K_\text{cache}; k],\; V = [V_\text{cache}; v];\quad
        \text{out} = \operatorname{softmax}\!\Big(\frac{q K^\top}{\sqrt{d_k}} + M\Big) V\, W^O

    where new query :math:`i` may see keys :math:`0 .. p+i` (:math:`M` is the last :math:`n` rows of the
    causal mask of length :math:`p+n`, built as those rows only). Only the new keys are rotated; the cached ones were rotated when
    they were new. ``MultiHeadAttention.forward(x, cache=cache, layer_idx=l)`` runs this.

    Args:
        mha: a :class:`~helpers.attention.MultiHeadAttention` (its projections, :meth:`rotate`, :meth:`attend`).
        x: ``(batch, n, d_model)``, the new tokens' inputs to this layer.
        cache: any object with ``seq_len(layer_idx)`` and ``update(layer_idx, key, value)`` (append
            ``(b, g, n, d_k)`` keys and values, return all of them), e.g. a :class:`KVCache`: the same return
            contract as Hugging Face's ``cache.update``, but Hugging Face cache objects are not accepted (their
            ``update(key_states, value_states, layer_idx)`` takes another order). Updated in place.
        layer_idx: which layer of the cache this attention owns.
        mask: bool (True = allowed) or additive float mask broadcastable to ``(batch, heads, n, p + n)``;
            default the causal rows above.
        head_mask, need_weights: as in ``MultiHeadAttention.forward``.
        positions: RoPE positions of the new tokens ``(n,)`` or ``(batch, n)``; default ``p .. p+n-1``.
            (Passing ``0 .. n-1`` reproduces the classic off-by-position bug.)

    Returns:
        ``(output (batch, n, d_model), weights (batch, heads, n, p + n) or None)``.
    """
    if not (callable(getattr(cache, "update", None)) and callable(getattr(cache, "seq_len", None))):
        raise TypeError("cache must be a KV cache with update(layer_idx, key, value) and seq_len(layer_idx) "
                        f"(e.g. helpers.kvcache.KVCache), got {type(cache).__name__}")
    past = cache.seq_len(layer_idx)  # p: the new tokens sit at positions p .. p+n-1
    mask = mha.check_inputs(x, x, x, mask, positions, past=past, head_mask=head_mask)
    n = x.shape[1]
    q, k, v = (mha.split_heads(lin(x)) for lin in (mha.linear_q, mha.linear_k, mha.linear_v))  # (b, h or g, n, d_k)
    if mha.rope:  # rule 1: rotate at the absolute positions, not at 0 .. n-1
        positions = torch.arange(past, past + n, device=x.device) if positions is None else positions
        q, k = mha.rotate(q, positions), mha.rotate(k, positions)
    k, v = cache.update(layer_idx, k, v)  # rule 2: keys are cached after RoPE; (b, g, p + n, d_k)
    if mask is None:  # new query i sees keys 0 .. p + i
        mask = torch.arange(past, past + n, device=x.device)[:, None] >= torch.arange(past + n, device=x.device)  # (n, p + n)
    return mha.attend(q, k, v, mask, head_mask, need_weights)


@torch.no_grad()
def greedy_generate(
    model, tokens: torch.Tensor, max_new_tokens: int, use_cache: bool = True, return_logits: bool = False
):
    r"""Greedy decoding: append :math:`\arg\max` of the last position's logits, ``max_new_tokens`` times.

    * ``use_cache=False``: every step runs the model on the whole sequence so far
      (:math:`n` prompt tokens, then :math:`n+1`, ...): quadratic work in the generated length.
    * ``use_cache=True``: one forward over the prompt fills a :class:`KVCache` ("prefill"), then
      every step feeds only the last generated token (``model(last, cache=cache)``).

    The two give the same tokens and the same logits up to float rounding.

    Args:
        model: a causal model called as ``model(tokens, need_weights=False)`` and
            ``model(tokens, cache=cache, need_weights=False)`` returning logits
            ``(batch, seq, vocab)``, with ``num_layers`` (e.g. :class:`~helpers.model.TinyTransformer`).
        tokens: ``(batch, prompt_len)`` token ids, prompt_len >= 1.
        max_new_tokens: number of tokens to generate (>= 0).
        use_cache: decode with a :class:`KVCache`.
        return_logits: also return the logits that chose each new token.

    Returns:
        ``(batch, prompt_len + max_new_tokens)`` tokens, and with ``return_logits`` the logits
        ``(batch, max_new_tokens, vocab)``.
    """
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.shape[1] < 1:
        raise ValueError(f"tokens must be a (batch, prompt_len) tensor with prompt_len >= 1, got "
                         f"{tuple(tokens.shape) if isinstance(tokens, torch.Tensor) else type(tokens).__name__}")
    check_int(max_new_tokens, "max_new_tokens", 0)
    if not isinstance(use_cache, bool):
        raise TypeError(f"use_cache must be a bool, got {type(use_cache).__name__} ({use_cache!r})")
    out, logits = tokens, []
    cache = KVCache(model.num_layers) if use_cache else None
    step_input = tokens
    for _ in range(max_new_tokens):
        if use_cache:
            last = model(step_input, cache=cache, need_weights=False)[:, -1]
        else:
            last = model(out, need_weights=False)[:, -1]
        nxt = last.argmax(-1, keepdim=True)
        logits.append(last)
        out = torch.cat([out, nxt], dim=1)
        step_input = nxt
    if not return_logits:
        return out
    if not logits:  # max_new_tokens == 0
        return out, tokens.new_zeros(tokens.shape[0], 0, int(getattr(model, "vocab_size", 0)), dtype=torch.float32)
    return out, torch.stack(logits, dim=1)
