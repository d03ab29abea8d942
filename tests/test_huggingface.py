"""The series' from-scratch RoPE and attention equal Hugging Face Llama's (notebook 07).

If a future ``transformers`` changes a convention (RoPE layout, scaling, mask, repeat_kv),
these tests fail loudly. Models are built from configs with random weights: nothing is
downloaded.
"""
from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # at collection, in every worker: no test reaches the hub

from helpers import apply_rope, causal_mask, interleaved_to_half
from helpers.hf import hf_permute_for_rope, llama_causal_mask, mha_from_llama


@pytest.fixture(scope="module", autouse=True)
def _transformers():
    """transformers is imported when this module's first test runs, not at collection: both workers
    collect every file, and the import costs each of them about 2.5 s (issue 32)."""
    global transformers, LlamaConfig, LlamaAttention, LlamaRotaryEmbedding, apply_rotary_pos_emb
    transformers = pytest.importorskip("transformers")
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding, apply_rotary_pos_emb


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
    cos, sin = LlamaRotaryEmbedding(cfg)(x, pos)  # Llama's own rotation of x (passed as q and as k)
    theirs, _ = apply_rotary_pos_emb(x, x, cos, sin)
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=1e-5)


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


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_mha_from_llama_carries_attention_dropout(kv_heads):
    """attention_dropout > 0 is carried over: in training mode, with the same RNG state, the outputs
    equal HF's (the same F.dropout mask on the probabilities); HF returns the weights after dropout,
    the series' module before (rows sum to 1); in eval mode nothing is dropped."""
    cfg = _config(kv_heads=kv_heads)
    cfg.attention_dropout = 0.5
    torch.manual_seed(0)
    layer = LlamaAttention(cfg, layer_idx=0).train()
    ours = mha_from_llama(layer, cfg).train()
    assert ours.dropout == 0.5
    assert mha_from_llama(LlamaAttention(_config(), layer_idx=0), _config()).dropout == 0.0
    x = torch.randn(2, 10, 64, generator=torch.Generator().manual_seed(1))
    pe = LlamaRotaryEmbedding(cfg)(x, torch.arange(10).expand(2, 10))
    torch.manual_seed(5)
    out_hf, w_hf = layer(x, position_embeddings=pe, attention_mask=llama_causal_mask(2, 10))
    torch.manual_seed(5)
    out_ours, w_ours = ours(x, mask=causal_mask(10))
    torch.testing.assert_close(out_ours, out_hf, atol=1e-5, rtol=1e-5)
    kept = w_hf != 0
    assert (~kept & (w_ours > 0)).any()                                   # some probabilities were dropped
    torch.testing.assert_close(w_hf, torch.where(kept, 2 * w_ours, torch.zeros_like(w_ours)))  # after vs before dropout
    torch.testing.assert_close(w_ours.sum(-1), torch.ones(2, 4, 10))
    torch.manual_seed(6)
    other, _ = ours(x, mask=causal_mask(10))
    assert (other - out_hf).abs().max() > 1e-3                             # another mask: another output (not a no-op)
    with torch.no_grad():
        eval_hf, _ = layer.eval()(x, position_embeddings=pe, attention_mask=llama_causal_mask(2, 10))
        torch.testing.assert_close(ours.eval()(x, mask=causal_mask(10))[0], eval_hf, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("bad", [1.0, -0.1, 1.5])
def test_mha_from_llama_refuses_bad_attention_dropout(bad):
    cfg = _config()
    cfg.attention_dropout = bad
    with pytest.raises(ValueError, match=r"config.attention_dropout must be a number in \[0, 1\), got"):
        mha_from_llama(LlamaAttention(_config(), layer_idx=0), cfg)


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
    with pytest.raises(ValueError, match="w.shape\\[0\\] must be divisible by num_heads, got 10 and 4"):
        hf_permute_for_rope(torch.randn(10, 8), 4)
    yarn = _config()
    yarn.rope_parameters = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 32}
    with pytest.raises(ValueError, match=r"config rope_type must be one of \('default', 'linear', 'llama3'\), got 'yarn'"):
        mha_from_llama(LlamaAttention(_config(), layer_idx=0), yarn)
    partial = _config()
    partial.rope_parameters = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
    with pytest.raises(ValueError, match="partial_rotary_factor must be 1.0"):
        mha_from_llama(LlamaAttention(_config(), layer_idx=0), partial)
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


# --------------------------------------------------------------------------- RoPE types (notebook 07 §5)
LLAMA3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 16}


def _config_rope(rope_parameters, heads=4, kv_heads=4, d=64):
    return LlamaConfig(vocab_size=32, hidden_size=d, intermediate_size=2 * d, num_hidden_layers=2,
                       num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=64,
                       rope_parameters=dict(rope_parameters), attn_implementation="eager", initializer_range=0.1)


@pytest.mark.parametrize("head_dim, original", [(128, 8192), (16, 32), (64, 64)])
def test_llama3_frequencies_equal_hf(head_dim, original):
    from helpers.rope import llama3_frequencies

    params = {**LLAMA3, "original_max_position_embeddings": original}
    cfg = LlamaConfig(hidden_size=2 * head_dim, num_attention_heads=2, max_position_embeddings=2 * original,
                      rope_parameters=params)
    hf = LlamaRotaryEmbedding(cfg).inv_freq
    ours = llama3_frequencies(head_dim, 500000.0, 8.0, 1.0, 4.0, original)
    # HF computes in float32, ours in float64 rounded once: equal to float32 rounding
    torch.testing.assert_close(ours, hf, rtol=1e-6, atol=0)
    plain = 500000.0 ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    wavelen = 2 * torch.pi / plain
    fast, slow = wavelen < original / 4.0, wavelen > original / 1.0
    assert fast.any() and slow.any()  # each config exercises both ends
    torch.testing.assert_close(ours[fast].double(), plain[fast], rtol=1e-6, atol=0)       # unchanged
    torch.testing.assert_close(ours[slow].double(), plain[slow] / 8, rtol=1e-6, atol=0)   # divided by the factor


@pytest.mark.parametrize("params", [LLAMA3, {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
                                    {"rope_type": "default", "rope_theta": 500000.0}])
@pytest.mark.parametrize("kv_heads", [4, 2])
def test_mha_from_llama_reproduces_scaled_rope(params, kv_heads):
    from helpers.hf import llama_rope_frequencies

    cfg = _config_rope(params, kv_heads=kv_heads)
    torch.manual_seed(0)
    layer = LlamaAttention(cfg, layer_idx=0).eval()
    ours = mha_from_llama(layer, cfg).eval()
    torch.testing.assert_close(llama_rope_frequencies(cfg), LlamaRotaryEmbedding(cfg).inv_freq, rtol=1e-6, atol=0)
    B, L = 2, 40  # positions beyond original_max_position_embeddings=16
    x = torch.randn(B, L, 64, generator=torch.Generator().manual_seed(4))
    pos = torch.arange(L).expand(B, L)
    with torch.no_grad():
        theirs, _ = layer(x, position_embeddings=LlamaRotaryEmbedding(cfg)(x, pos), attention_mask=llama_causal_mask(B, L))
        out, _ = ours(x, mask=torch.ones(L, L, dtype=torch.bool).tril())
        plain = mha_from_llama(layer, _config_rope({"rope_type": "default", "rope_theta": params["rope_theta"]}, kv_heads=kv_heads))
        out_plain, _ = plain(x, mask=torch.ones(L, L, dtype=torch.bool).tril())
    torch.testing.assert_close(out, theirs, atol=1e-5, rtol=1e-5)
    if params["rope_type"] != "default":
        assert (out_plain - theirs).abs().max() > 1e-3  # the scaling matters: plain RoPE would differ


def test_rope_inv_freq_survives_bfloat16_cast():
    cfg = _config_rope(LLAMA3)
    mha = mha_from_llama(LlamaAttention(cfg, layer_idx=0), cfg).to(torch.bfloat16)
    assert mha.linear_q.weight.dtype == torch.bfloat16 and mha.rope_inv_freq.dtype == torch.float32


# --------------------------------------------------------------------------- private APIs, isolated
def test_attn_implementation_reads_the_config():
    """helpers.hf.attn_implementation is the single reader of the private config._attn_implementation.
    If transformers renames or re-means it, this fails here rather than deep inside LlamaForHeads."""
    from transformers import LlamaForCausalLM

    from helpers.hf import attn_implementation

    for impl in ("eager", "sdpa"):
        cfg = LlamaConfig(vocab_size=16, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                          attn_implementation=impl)
        assert attn_implementation(cfg) == impl
        assert attn_implementation(LlamaForCausalLM(cfg).config) == impl
    lm = LlamaForCausalLM(cfg)
    lm.set_attn_implementation("eager")  # the public setter is seen by the getter
    assert attn_implementation(lm.config) == "eager"
    with pytest.raises(AttributeError, match="transformers changed how it records the attention kernel"):
        attn_implementation(object())


def test_bfloat16_cast_rounds_inv_freq_but_from_pretrained_keeps_float32(tmp_path):
    """The library behaviour notebook 07 §5 shows: .to(bfloat16) casts the inv_freq buffer, while
    from_pretrained(dtype=bfloat16) builds the model under that default dtype and inv_freq is
    created explicitly in float32."""
    from transformers import LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    cfg = LlamaConfig(vocab_size=16, hidden_size=256, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                      rope_theta=500000.0, attn_implementation="eager")
    torch.manual_seed(0)
    lm = LlamaForCausalLM(cfg)
    ref = lm.model.rotary_emb.inv_freq.clone()
    assert ref.dtype == torch.float32
    lm.save_pretrained(tmp_path)
    loaded = LlamaForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16)
    assert loaded.model.layers[0].self_attn.q_proj.weight.dtype == torch.bfloat16
    assert loaded.model.rotary_emb.inv_freq.dtype == torch.float32 and torch.equal(loaded.model.rotary_emb.inv_freq, ref)
    cast = lm.to(torch.bfloat16).model.rotary_emb.inv_freq
    assert cast.dtype == torch.bfloat16
    rel = ((cast.double() - ref.double()).abs() / ref.double()).max().item()
    assert 1e-3 < rel < 4e-3  # bfloat16 keeps 8 significant bits: relative error up to 2^-8
    assert (cast.double() - ref.double()).abs().max().item() * 1024 > 1.0  # > 1 rad of angle error at m = 1024


# --------------------------------------------------------------------------- KV cache (notebook 07 §6)
@pytest.mark.parametrize("params", [{"rope_type": "default", "rope_theta": 500000.0}, LLAMA3])
@pytest.mark.parametrize("kv_heads", [4, 2])
def test_hf_generate_equals_series_attention_with_kv_cache(params, kv_heads):
    from transformers import LlamaForCausalLM

    from helpers.hf import generate_with_series_attention

    torch.manual_seed(0)
    lm = LlamaForCausalLM(_config_rope(params, kv_heads=kv_heads)).eval()
    x = torch.randint(0, 32, (2, 5), generator=torch.Generator().manual_seed(1))
    out = lm.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=20, do_sample=False, eos_token_id=None,
                      pad_token_id=0, return_dict_in_generate=True, output_logits=True)
    toks, logits = generate_with_series_attention(lm, x, 20)
    assert torch.equal(out.sequences, toks)
    torch.testing.assert_close(logits, torch.stack(out.logits, 1), atol=1e-5, rtol=1e-5)
    toks_u, logits_u = generate_with_series_attention(lm, x, 20, use_cache=False)
    assert torch.equal(toks_u, toks)
    torch.testing.assert_close(logits_u, logits, atol=1e-5, rtol=1e-5)
    assert len(set(toks[:, 5:].flatten().tolist())) >= 2


def test_kv_cache_holds_the_same_keys_as_hf_dynamic_cache():
    from transformers import DynamicCache

    from helpers.kvcache import KVCache, kv_cache_bytes

    cfg = _config_rope({"rope_type": "default", "rope_theta": 500000.0}, kv_heads=2)
    torch.manual_seed(0)
    layer = LlamaAttention(cfg, layer_idx=0).eval()
    ours = mha_from_llama(layer, cfg).eval()
    x = torch.randn(1, 7, 64, generator=torch.Generator().manual_seed(5))
    rope = LlamaRotaryEmbedding(cfg)
    theirs, mine = DynamicCache(config=cfg), KVCache(1)
    with torch.no_grad():
        for start, size in [(0, 4), (4, 1), (5, 1), (6, 1)]:
            h = x[:, start:start + size]
            pos = torch.arange(start, start + size)[None]
            mask = torch.zeros(1, 1, size, start + size).masked_fill(
                torch.ones(start + size, start + size, dtype=torch.bool).tril()[start:] == 0, torch.finfo(torch.float32).min)
            o_hf, _ = layer(h, position_embeddings=rope(h, pos), attention_mask=mask, cache=theirs)
            o, _ = ours(h, cache=mine)
            torch.testing.assert_close(o, o_hf, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(mine.keys[0], theirs.layers[0].keys, atol=1e-6, rtol=1e-5)     # both store rotated keys
    torch.testing.assert_close(mine.values[0], theirs.layers[0].values, atol=1e-6, rtol=1e-5)
    hf_bytes = theirs.layers[0].keys.nbytes + theirs.layers[0].values.nbytes
    assert mine.nbytes() == hf_bytes == kv_cache_bytes(1, 2, 16, 7)
