"""Bridges from the series' from-scratch modules to Hugging Face ``transformers`` (notebook 07).

* :func:`mha_from_llama` -- a :class:`helpers.MultiHeadAttention` holding the weights of a
  ``LlamaAttention`` layer (bias-free projections, half-layout RoPE, grouped K/V heads).
* :func:`llama_causal_mask` -- the additive ``(batch, 1, q, k)`` mask that Llama's eager
  attention adds to its scores.
* :func:`hf_permute_for_rope` -- the per-head row permutation that checkpoint converters
  apply to ``W_q``/``W_k`` trained for the interleaved layout (Meta's original Llama) so
  that the half layout (Hugging Face) gives identical scores.
* :func:`llama_rope_frequencies` -- the per-pair RoPE frequencies a Llama config asks for
  (``rope_type`` ``"default"``, ``"linear"`` or ``"llama3"``), computed by :mod:`helpers.rope`.
* :func:`generate_with_series_attention` -- greedy decoding of a ``LlamaForCausalLM`` whose
  attention layers are replaced by the series' :class:`MultiHeadAttention` with a
  :class:`helpers.kvcache.KVCache` (everything else, RMSNorm and SwiGLU, is HF's).
* :func:`attn_implementation` -- which attention kernel a config selects (the one place that
  reads the private ``config._attn_implementation``: ``transformers`` 5.24 has no public getter).

This module never imports ``transformers``: it reads the configs and modules it is given, so the
rest of ``helpers`` does not need the library. Nothing is downloaded: models are built from a
config with random weights.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from .attention import MultiHeadAttention, causal_mask
from .kvcache import greedy_generate
from .rope import interleaved_to_half_index, llama3_frequencies, rope_frequencies

__all__ = ["llama_causal_mask", "mha_from_llama", "hf_permute_for_rope", "LlamaForHeads",
           "SUPPORTED_ROPE_TYPES", "llama_rope_frequencies", "generate_with_series_attention", "attn_implementation"]

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


def llama_causal_mask(batch: int, seq: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``(batch, 1, seq, seq)``: 0 where a query may attend (key <= query), the dtype's most
    negative number elsewhere (what ``transformers`` adds to the scores in eager attention)."""
    allowed = torch.ones(seq, seq, dtype=torch.bool).tril()
    mask = torch.zeros(seq, seq, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    return mask.expand(batch, 1, seq, seq)


def mha_from_llama(layer: nn.Module, config) -> MultiHeadAttention:
    r"""A :class:`MultiHeadAttention` with the weights of ``layer`` (a ``LlamaAttention``).

    ``q_proj, k_proj, v_proj, o_proj`` map to ``linear_q, linear_k, linear_v, linear_out``;
    RoPE uses the half layout and ``config.rope_theta``; ``num_key_value_heads`` becomes
    ``num_kv_heads``. Biases are copied when the layer has them (``attention_bias=True``).
    ``config.attention_dropout`` becomes ``dropout`` (``ValueError`` outside [0, 1)): both apply
    ``F.dropout`` to the softmax probabilities in training mode only, so with the same torch RNG
    state the two draw the same mask and give the same outputs. The returned weights differ in
    training mode with ``dropout > 0``: ``LlamaAttention`` (eager) returns them *after* dropout,
    :class:`MultiHeadAttention` *before* (``nn.MultiheadAttention``, like ``LlamaAttention``, returns
    them after: torch 2.13's ``F.multi_head_attention_forward`` drops them before the product with ``v``).

    RoPE types: ``"default"`` (:math:`\theta_i = \text{rope\_theta}^{-2i/d}`), ``"linear"``
    (every :math:`\theta_i` divided by ``factor``: position interpolation) and ``"llama3"``
    (:func:`helpers.rope.llama3_frequencies`); the module then carries those frequencies in
    ``rope_inv_freq``. Any other type (``"yarn"``, ``"dynamic"``, ``"longrope"`` ...) also
    rescales cos/sin or depends on the sequence length, which :class:`MultiHeadAttention` does
    not reproduce, so it raises ``ValueError`` instead of returning a module that silently differs.
    """
    d_model, h = config.hidden_size, config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or h
    head_dim = getattr(config, "head_dim", None) or d_model // h
    if head_dim * h != d_model:
        raise ValueError(f"head_dim * num_attention_heads must equal hidden_size, got {head_dim} * {h} != {d_model}")
    inv_freq = llama_rope_frequencies(config)  # raises for unsupported rope types
    rope_theta = _rope_theta(config)
    bias = layer.q_proj.bias is not None
    p_drop = _attention_dropout(config)
    mha = MultiHeadAttention(d_model, h, bias=bias, rope=True, rope_base=rope_theta, rope_layout="half",
                             num_kv_heads=kv, dropout=p_drop)
    if _rope_type(config) != "default":
        mha.rope_inv_freq = inv_freq
    with torch.no_grad():
        for ours, theirs in [(mha.linear_q, layer.q_proj), (mha.linear_k, layer.k_proj),
                             (mha.linear_v, layer.v_proj), (mha.linear_out, layer.o_proj)]:
            ours.weight.copy_(theirs.weight)
            if bias:
                ours.bias.copy_(theirs.bias)
    return mha.to(layer.q_proj.weight.dtype)


def _attention_dropout(config) -> float:
    """``config.attention_dropout`` (``None`` -> 0.0) as a float in [0, 1), else ``ValueError``."""
    p = getattr(config, "attention_dropout", 0.0)
    p = 0.0 if p is None else p
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= float(p) < 1.0:
        raise ValueError(f"config.attention_dropout must be a number in [0, 1), got {p!r}")
    return float(p)


def _rope_type(config) -> str:
    params = _rope_params(config)
    return str(params.get("rope_type", params.get("type", "default")) or "default")


def _rope_theta(config) -> float:
    theta = getattr(config, "rope_theta", None)
    if theta is None:
        params = getattr(config, "rope_parameters", None) or {}
        theta = params.get("rope_theta", 10000.0)
    return float(theta)


def _rope_params(config) -> dict:
    return getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}


def llama_rope_frequencies(config) -> torch.Tensor:
    r"""The float32 per-pair RoPE frequencies ``(head_dim // 2,)`` of a Llama config, from :mod:`helpers.rope`.

    * ``"default"``: :func:`~helpers.rope.rope_frequencies` ``(head_dim, rope_theta)``;
    * ``"linear"``: the same divided by ``factor`` (position interpolation, notebook 06);
    * ``"llama3"``: :func:`~helpers.rope.llama3_frequencies` with ``factor``, ``low_freq_factor``,
      ``high_freq_factor``, ``original_max_position_embeddings`` from ``config.rope_parameters``.

    Raises:
        ValueError: for another ``rope_type`` (naming :data:`SUPPORTED_ROPE_TYPES`), or a
            ``partial_rotary_factor`` other than 1.
    """
    rope_type = _rope_type(config)
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"config rope_type must be one of {SUPPORTED_ROPE_TYPES}, got {rope_type!r}: "
            "its frequency or cos/sin scaling is not reproduced by MultiHeadAttention"
        )
    params = _rope_params(config)
    if float(params.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ValueError(f"partial_rotary_factor must be 1.0 (RoPE on the whole head), "
                         f"got {params['partial_rotary_factor']}")
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    theta = _rope_theta(config)
    if rope_type == "default":
        return rope_frequencies(head_dim, theta)
    if rope_type == "linear":
        return (rope_frequencies(head_dim, theta, dtype=torch.float64) / float(params["factor"])).float()
    return llama3_frequencies(
        head_dim, theta, factor=float(params["factor"]), low_freq_factor=float(params["low_freq_factor"]),
        high_freq_factor=float(params["high_freq_factor"]),
        original_max_position_embeddings=int(params["original_max_position_embeddings"]),
    )


def attn_implementation(config) -> Optional[str]:
    """The attention kernel a ``transformers`` config selects (``"eager"``, ``"sdpa"``, ...).

    ``transformers`` 5.24 stores it in the private property ``config._attn_implementation``
    (``PreTrainedConfig``; the public ``set_attn_implementation`` on the model only writes it)
    and offers no public getter, so this is the one place that reads it;
    ``tests/test_huggingface.py`` fails loudly if the property disappears or changes meaning.
    """
    if not hasattr(config, "_attn_implementation"):
        raise AttributeError(
            f"{type(config).__name__} has no _attn_implementation: transformers changed how it records the attention "
            "kernel; update helpers.hf.attn_implementation"
        )
    return config._attn_implementation


def hf_permute_for_rope(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Rows of ``W_q`` or ``W_k`` ``(num_heads * head_dim, d_model)`` reordered within each head by
    :func:`~helpers.interleaved_to_half_index`: weights trained with interleaved RoPE then
    give the same scores with half-layout RoPE (``permute`` in HF's Llama conversion script)."""
    out_features = w.shape[0]
    if out_features % num_heads:
        raise ValueError(f"w.shape[0] must be divisible by num_heads, got {out_features} and {num_heads}")
    head_dim = out_features // num_heads
    perm = interleaved_to_half_index(head_dim)
    return w.view(num_heads, head_dim, -1)[:, perm].reshape_as(w)


class LlamaForHeads(nn.Module):
    """A Hugging Face ``LlamaForCausalLM`` seen through the series' interface, so that
    :func:`helpers.train.train` and the head tools of :mod:`helpers.heads` work on it unchanged.

    * ``forward(tokens, head_mask=None, need_weights=True) -> logits`` ``(batch, seq, vocab)``;
    * ``num_layers``, ``num_heads``, ``blocks`` (the decoder layers) and, after a forward with
      ``need_weights=True``, ``attention_weights``: one detached ``(batch, heads, seq, seq)``
      tensor per layer (``output_attentions=True``; needs ``attn_implementation="eager"``);
    * ``head_mask`` ``(num_layers, num_heads)`` or ``(batch, num_layers, num_heads)`` multiplies
      each head's output before ``o_proj``, like ``MultiHeadAttention(head_mask=...)``. It is
      applied by a forward pre-hook on every ``o_proj``: the Llama code itself is untouched.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        cfg = model.config
        impl = attn_implementation(cfg)
        if impl != "eager":
            raise ValueError(
                f"model must use attn_implementation='eager' (got {impl!r}): fused kernels such as 'sdpa' "
                "return no attention weights, so attention_weights would stay empty"
            )
        self.model = model
        self.num_layers = cfg.num_hidden_layers
        self.num_heads = cfg.num_attention_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.blocks = model.model.layers
        self.attention_weights: list[torch.Tensor] = []
        self._head_mask: Optional[torch.Tensor] = None
        for i, layer in enumerate(self.blocks):
            layer.self_attn.o_proj.register_forward_pre_hook(self._make_hook(i))

    def _make_hook(self, layer_index: int):
        def hook(module, args):
            if self._head_mask is None:
                return None
            (x,) = args  # (batch, seq, heads * head_dim): the concatenated head outputs
            m = self._head_mask[..., layer_index, :]  # (heads,) or (batch, heads)
            shape = (x.shape[0] if m.dim() == 2 else 1, 1, self.num_heads, 1)
            x = (x.unflatten(-1, (self.num_heads, self.head_dim)) * m.reshape(shape).to(x.dtype)).flatten(-2)
            return (x,)

        return hook

    def forward(self, tokens: torch.Tensor, head_mask: Optional[torch.Tensor] = None,
                need_weights: bool = True) -> torch.Tensor:
        if head_mask is not None:
            expected = {(self.num_layers, self.num_heads), (tokens.shape[0], self.num_layers, self.num_heads)}
            if tuple(head_mask.shape) not in expected:
                raise ValueError(
                    f"head_mask must have shape (num_layers, num_heads) = {(self.num_layers, self.num_heads)} "
                    f"or (batch, num_layers, num_heads), got {tuple(head_mask.shape)}"
                )
        self._head_mask = head_mask
        try:
            out = self.model(input_ids=tokens, output_attentions=need_weights, use_cache=False)
        finally:
            self._head_mask = None
        if need_weights:
            self.attention_weights = [w.detach() for w in out.attentions]
        return out.logits


@torch.no_grad()
def generate_with_series_attention(model: nn.Module, tokens: torch.Tensor, max_new_tokens: int, use_cache: bool = True):
    """Greedy decoding of a ``LlamaForCausalLM`` in which every ``self_attn`` is the series' attention.

    Each layer runs ``x + MHA(input_layernorm(x))`` then ``x + mlp(post_attention_layernorm(x))``
    (the order of ``LlamaDecoderLayer.forward``), where ``MHA`` is :func:`mha_from_llama` of that
    layer; embedding, norms, MLP and ``lm_head`` are the model's own modules. With ``use_cache``
    the MHAs share one :class:`~helpers.kvcache.KVCache` (prefill, then one token per step);
    without it every step reruns the whole sequence with the causal mask.

    Args:
        model: a ``LlamaForCausalLM`` (any ``rope_type`` :func:`mha_from_llama` accepts).
        tokens: ``(batch, prompt_len)`` token ids, prompt_len >= 1, unpadded: there is no
            attention mask, so a left-padded batch would be decoded as if its pads were tokens
            (Hugging Face's ``generate(attention_mask=...)`` masks them).
        max_new_tokens: int >= 0.

    Returns:
        ``(tokens (batch, prompt_len + max_new_tokens), logits (batch, max_new_tokens, vocab))``.
    """
    inner, cfg = model.model, model.config
    attns = [mha_from_llama(layer.self_attn, cfg).eval() for layer in inner.layers]

    class _Series(nn.Module):
        num_layers = len(attns)

        def forward(self, toks, cache=None, need_weights=False):
            x = inner.embed_tokens(toks)
            n = toks.shape[1]
            for i, layer in enumerate(inner.layers):
                h = layer.input_layernorm(x)
                if cache is None:
                    a, _ = attns[i](h, mask=causal_mask(n, device=toks.device), need_weights=False)
                else:
                    a, _ = attns[i](h, cache=cache, layer_idx=i, need_weights=False)
                x = x + a
                x = x + layer.mlp(layer.post_attention_layernorm(x))
            return model.lm_head(inner.norm(x))

    return greedy_generate(_Series(), tokens, max_new_tokens, use_cache=use_cache, return_logits=True)
