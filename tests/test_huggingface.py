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


@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (4, 2), (4, 1)])
def test_llama_attention_equals_multi_head_attention(heads, kv_heads):
    torch.manual_seed(0)
    cfg = _config(heads, kv_heads)
    layer = LlamaAttention(cfg, layer_idx=0).eval()
    ours = mha_from_llama(layer, cfg).eval()
    assert ours.num_kv_heads == kv_heads and ours.linear_q.bias is None
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


def test_errors():
    with pytest.raises(ValueError, match=r"x must be \(batch, heads, seq, head_dim\)"):
        llama_rope(torch.randn(3, 4), torch.zeros(1, 3, dtype=torch.long), _config())
    with pytest.raises(ValueError, match="w.shape\\[0\\] must be divisible by num_heads, got 10 and 4"):
        hf_permute_for_rope(torch.randn(10, 8), 4)
