"""The series' from-scratch RoPE and attention equal Hugging Face Llama's (notebook 07).

If a future ``transformers`` changes a convention (RoPE layout, scaling, mask, repeat_kv),
these tests fail loudly. Models are built from configs with random weights: nothing is
downloaded.
"""
from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding  # noqa: E402

from helpers import apply_rope, interleaved_to_half  # noqa: E402
from helpers.hf import hf_permute_for_rope, llama_causal_mask, llama_rope, mha_from_llama  # noqa: E402


def _config(heads=4, kv_heads=4, d=64, theta=10000.0):
    return LlamaConfig(vocab_size=32, hidden_size=d, intermediate_size=2 * d, num_hidden_layers=1,
                       num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=128,
                       rope_theta=theta, attn_implementation="eager")


@pytest.mark.parametrize("theta", [10000.0, 500000.0])
def test_llama_rope_equals_apply_rope_half(theta):
    cfg = _config(theta=theta)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 12, 16, generator=g)
    pos = torch.tensor([list(range(12)), list(range(30, 42))])
    ours = torch.stack([apply_rope(x[b], pos[b], base=theta, layout="half") for b in range(2)])
    torch.testing.assert_close(llama_rope(x, pos, cfg), ours, atol=1e-5, rtol=1e-5)


def test_converter_permutation_makes_layouts_interchangeable():
    g = torch.Generator().manual_seed(1)
    heads, hd, d = 4, 16, 64
    W_q, W_k, X = torch.randn(d, d, generator=g), torch.randn(d, d, generator=g), torch.randn(10, d, generator=g)

    def scores(Wq, Wk, layout):
        q = (X @ Wq.T).view(10, heads, hd).transpose(0, 1)
        k = (X @ Wk.T).view(10, heads, hd).transpose(0, 1)
        return apply_rope(q, layout=layout) @ apply_rope(k, layout=layout).transpose(-1, -2)

    ref = scores(W_q, W_k, "interleaved")
    torch.testing.assert_close(scores(hf_permute_for_rope(W_q, heads), hf_permute_for_rope(W_k, heads), "half"), ref, atol=1e-4, rtol=1e-5)
    assert (scores(W_q, W_k, "half") - ref).abs().max() > 0.1  # without the permutation they differ
    # the per-head row permutation is notebook 02's interleaved_to_half on each head's rows
    torch.testing.assert_close(hf_permute_for_rope(W_q, heads).view(heads, hd, d),
                               interleaved_to_half(W_q.view(heads, hd, d).transpose(1, 2)).transpose(1, 2))


@pytest.mark.parametrize("heads, kv_heads, theta", [(4, 4, 10000.0), (4, 2, 10000.0), (4, 1, 10000.0), (4, 2, 500000.0)])
def test_llama_attention_equals_multi_head_attention(heads, kv_heads, theta):
    torch.manual_seed(0)
    cfg = _config(heads, kv_heads, theta=theta)
    layer = LlamaAttention(cfg, layer_idx=0).eval()
    ours = mha_from_llama(layer, cfg).eval()
    assert ours.num_kv_heads == kv_heads and ours.linear_q.bias is None and ours.rope_base == theta
    g = torch.Generator().manual_seed(2)
    B, L = 2, 9
    x = torch.randn(B, L, 64, generator=g)
    pos = torch.arange(L).expand(B, L)
    cos_sin = LlamaRotaryEmbedding(cfg)(x, pos)
    with torch.no_grad():
        theirs, w_theirs = layer(x, position_embeddings=cos_sin, attention_mask=llama_causal_mask(B, L))
        out, w = ours(x, mask=torch.ones(L, L, dtype=torch.bool).tril())
    torch.testing.assert_close(out, theirs, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(w, w_theirs, atol=1e-6, rtol=1e-5)


def test_llama_causal_mask_equals_the_mask_hf_passes_to_attention():
    """Capture the mask LlamaModel itself builds and hands to its eager attention layers."""
    lm = _small_lm()
    seen = {}

    def grab(module, args, kwargs):
        seen["mask"] = kwargs.get("attention_mask")

    handle = lm.model.layers[0].self_attn.register_forward_pre_hook(grab, with_kwargs=True)
    with torch.no_grad():
        lm(input_ids=torch.randint(0, 16, (2, 6), generator=torch.Generator().manual_seed(3)))
    handle.remove()
    mask = seen["mask"]
    assert mask is not None and mask.dtype == torch.float32
    torch.testing.assert_close(mask.expand(2, 1, 6, 6), llama_causal_mask(2, 6), rtol=0, atol=0)


def test_errors():
    with pytest.raises(ValueError, match=r"x must be \(batch, heads, seq, head_dim\)"):
        llama_rope(torch.randn(3, 4), torch.zeros(1, 3, dtype=torch.long), _config())
    with pytest.raises(ValueError, match="w.shape\\[0\\] must be divisible by num_heads, got 10 and 4"):
        hf_permute_for_rope(torch.randn(10, 8), 4)
    llama3 = _config()
    llama3.rope_parameters = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    with pytest.raises(ValueError, match="config rope_type must be 'default'.*got 'llama3'"):
        mha_from_llama(LlamaAttention(_config(), layer_idx=0), llama3)
    odd = _config()
    odd.head_dim = 12
    with pytest.raises(ValueError, match=r"head_dim \* num_attention_heads must equal hidden_size, got 12 \* 4 != 64"):
        mha_from_llama(LlamaAttention(_config(), layer_idx=0), odd)


def test_llama_for_heads_requires_eager_attention():
    from transformers import LlamaForCausalLM

    from helpers.hf import LlamaForHeads

    cfg = LlamaConfig(vocab_size=16, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                      num_key_value_heads=4, attn_implementation="sdpa")
    with pytest.raises(ValueError, match="model must use attn_implementation='eager' \\(got 'sdpa'\\)"):
        LlamaForHeads(LlamaForCausalLM(cfg))


def _small_lm(heads=4):
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=16, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=heads,
                      num_key_value_heads=heads, max_position_embeddings=32, attn_implementation="eager", initializer_range=0.1)
    return LlamaForCausalLM(cfg).eval()


def test_llama_for_heads_mask_equals_removing_the_head_slice():
    from helpers.hf import LlamaForHeads

    lm = _small_lm()
    wrapped = LlamaForHeads(lm)
    tokens = torch.randint(0, 16, (3, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 4)
    mask[1, 2] = 0.0
    with torch.no_grad():
        masked = wrapped(tokens, head_mask=mask)
        assert [tuple(w.shape) for w in wrapped.attention_weights] == [(3, 4, 7, 7)] * 2
        plain = wrapped(tokens)
        o = lm.model.layers[1].self_attn.o_proj
        saved = o.weight.clone()
        o.weight[:, 2 * 8 : 3 * 8] = 0.0  # head 2's columns of W^O (head_dim 8)
        removed = lm(input_ids=tokens).logits
        o.weight.copy_(saved)
    torch.testing.assert_close(masked, removed)
    assert (masked - plain).abs().max() > 1e-3
    torch.testing.assert_close(wrapped(tokens, head_mask=torch.ones(2, 4)), plain)


def test_llama_for_heads_head_mask_is_differentiable_and_checked():
    from helpers.hf import LlamaForHeads

    wrapped = LlamaForHeads(_small_lm())
    tokens = torch.randint(0, 16, (2, 5), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 4, requires_grad=True)
    wrapped(tokens, head_mask=mask, need_weights=False).sum().backward()
    assert mask.grad is not None and mask.grad.abs().sum() > 0
    with pytest.raises(ValueError, match=r"head_mask must have shape \(num_layers, num_heads\) = \(2, 4\)"):
        wrapped(tokens, head_mask=torch.ones(4))
