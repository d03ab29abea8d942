"""KV-cache decoding (helpers.kvcache, MultiHeadAttention(cache=...), TinyTransformer.generate; notebook 07 §6).

The reference is always full recomputation: the same model run on the whole sequence with the
causal mask (``F.scaled_dot_product_attention`` / the explicit path), never the cache itself.
"""
from __future__ import annotations

import pytest
import torch

from helpers import MultiHeadAttention, TinyTransformer, apply_rope, causal_mask
from helpers.kvcache import KVCache, cached_attention, greedy_generate, kv_cache_bytes


def _model(pos="rope", kv=None, layout="interleaved", layers=2, max_len=48, seed=0):
    return TinyTransformer(16, 32, 4, layers, max_len, pos=pos, num_kv_heads=kv, rope_layout=layout, seed=seed).eval()


def _prompt(b=3, n=5, seed=0):
    return torch.randint(0, 16, (b, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("pos, layout", [("rope", "interleaved"), ("rope", "half"), ("learned", "interleaved"),
                                         ("sinusoidal", "interleaved"), ("none", "interleaved")])
@pytest.mark.parametrize("kv", [4, 2, 1])
def test_cached_generation_equals_recomputation(pos, layout, kv):
    m = _model(pos, kv, layout)
    x = _prompt()
    toks_c, logits_c = m.generate(x, 30, use_cache=True, return_logits=True)
    toks_u, logits_u = m.generate(x, 30, use_cache=False, return_logits=True)
    assert toks_c.shape == (3, 35) and logits_c.shape == (3, 30, 16)
    assert torch.equal(toks_c, toks_u)
    torch.testing.assert_close(logits_c, logits_u)  # float32 default tolerances
    # and each chosen token is the arg-max of a full forward of the sequence before it
    with torch.no_grad():
        full = m(toks_c[:, :-1], need_weights=False)[:, 4:]
    torch.testing.assert_close(logits_c, full)
    assert torch.equal(full.argmax(-1), toks_c[:, 5:])


def test_generated_tokens_are_not_trivial():
    """Guard against a test that cannot fail: the random model does not emit one constant token."""
    toks = _model().generate(_prompt(), 30)
    assert len(set(toks[:, 5:].flatten().tolist())) >= 3


@pytest.mark.parametrize("kv", [4, 2])
@pytest.mark.parametrize("need_weights", [False, True])
def test_attention_in_chunks_equals_full_causal_attention(kv, need_weights):
    torch.manual_seed(0)
    mha = MultiHeadAttention(32, 4, rope=True, rope_layout="half", rope_base=500000.0, num_kv_heads=kv).eval()
    x = torch.randn(2, 11, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full, w_full = mha(x, mask=causal_mask(11))
        cache = KVCache(1)
        outs, start = [], 0
        for size in (4, 1, 3, 1, 2):  # prefill 4, then chunks of any size
            o, w = mha(x[:, start:start + size], cache=cache, need_weights=need_weights)
            if need_weights:
                assert w.shape == (2, 4, size, start + size)
                torch.testing.assert_close(w, w_full[:, :, start:start + size, :start + size])
            else:
                assert w is None
            outs.append(o)
            start += size
    torch.testing.assert_close(torch.cat(outs, 1), full)
    assert cache.seq_len() == 11


def test_the_decoding_step_is_a_function_and_takes_any_cache_with_the_hf_contract():
    """mha(x, cache=c) runs helpers.kvcache.cached_attention(mha, x, c); the cache is duck-typed (seq_len, update)."""

    class ListCache:  # Hugging Face's cache.update contract, nothing else
        def __init__(self):
            self.k, self.v = [], []

        def seq_len(self, layer_idx=0):
            return sum(t.shape[-2] for t in self.k)

        def update(self, layer_idx, key, value):
            self.k.append(key)
            self.v.append(value)
            return torch.cat(self.k, dim=-2), torch.cat(self.v, dim=-2)

    torch.manual_seed(0)
    mha = MultiHeadAttention(32, 4, rope=True, num_kv_heads=2).eval()
    x = torch.randn(2, 7, 32, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ours, theirs = KVCache(1), ListCache()
        for a, b in [(0, 3), (3, 4), (4, 7)]:
            o_method, w_method = mha(x[:, a:b], cache=ours)
            o_func, w_func = cached_attention(mha, x[:, a:b], theirs)
            assert torch.equal(o_method, o_func) and torch.equal(w_method, w_func)
        torch.testing.assert_close(cached_attention(mha, x, KVCache(1))[0], mha(x, mask=causal_mask(7))[0])
    assert torch.equal(ours.keys[0], torch.cat(theirs.k, dim=-2))


def test_cached_keys_are_stored_rotated_at_their_positions():
    torch.manual_seed(0)
    mha = MultiHeadAttention(32, 4, rope=True, num_kv_heads=2).eval()
    x = torch.randn(1, 6, 32, generator=torch.Generator().manual_seed(2))
    cache = KVCache(1)
    with torch.no_grad():
        mha(x[:, :4], cache=cache)
        mha(x[:, 4:], cache=cache)
        k = mha.linear_k(x).view(1, 6, 2, 8).transpose(1, 2)
        v = mha.linear_v(x).view(1, 6, 2, 8).transpose(1, 2)
    torch.testing.assert_close(cache.keys[0], apply_rope(k))  # rotated once, at 0..5
    torch.testing.assert_close(cache.values[0], v)  # values are never rotated


def test_cache_bytes_shrink_by_the_group_size():
    x = _prompt(b=2, n=6)
    sizes = {}
    for kv in (4, 2, 1):
        m = _model(kv=kv)
        cache = KVCache(m.num_layers)
        with torch.no_grad():
            m(x, cache=cache, need_weights=False)
            for _ in range(4):
                m(x[:, :1], cache=cache, need_weights=False)
        sizes[kv] = cache.nbytes()
        expected = sum(t.numel() * t.element_size() for t in cache.keys + cache.values)
        assert sizes[kv] == expected == kv_cache_bytes(2, kv, 8, 10, batch=2, dtype=torch.float32)
    assert sizes[4] == 2 * 2 * 4 * 8 * 10 * 2 * 4 == 10240
    assert sizes[4] // sizes[2] == 2 and sizes[4] // sizes[1] == 4
    assert kv_cache_bytes(32, 8, 128, 8192, dtype=torch.bfloat16) == 2**30  # Llama-3-8B, one 8k sequence: 1 GiB


def _decode_with_bug(m, x, steps, bug):
    """Cached greedy decoding with one of the two classic RoPE/cache bugs, written out."""
    cache = KVCache(m.num_layers)
    logits = []
    with torch.no_grad():
        last = m(x, cache=cache, need_weights=False)[:, -1]
        for _ in range(steps):
            nxt = last.argmax(-1, keepdim=True)
            logits.append(last)
            if bug == "position 0":
                last = m(nxt, cache=cache, positions=torch.zeros(1, dtype=torch.long), need_weights=False)[:, -1]
            else:  # "rotate twice": every step re-rotates all cached (already rotated) keys
                last = _step_rotating_cache_again(m, nxt, cache)
    return torch.stack(logits, 1)


def _step_rotating_cache_again(m, tok, cache):
    """One decoding step of a pre-LN TinyTransformer in which attention rotates the cached keys again."""
    x = m.tok_emb(tok)
    for i, blk in enumerate(m.blocks):
        a = blk.attn
        h = blk.ln1(x)
        past = cache.seq_len(i)
        q = a.split_heads(a.linear_q(h))
        k = a.linear_k(h).view(h.shape[0], 1, a.num_kv_heads, a.head_dim).transpose(1, 2)
        v = a.linear_v(h).view(h.shape[0], 1, a.num_kv_heads, a.head_dim).transpose(1, 2)
        pos = torch.tensor([past])
        q = apply_rope(q, pos, base=a.rope_base, layout=a.rope_layout)
        k = apply_rope(k, pos, base=a.rope_base, layout=a.rope_layout)
        K, V = cache.update(i, k, v)
        K = apply_rope(K, base=a.rope_base, layout=a.rope_layout)  # BUG: cached keys were rotated already
        out = torch.nn.functional.scaled_dot_product_attention(q, a.repeat_kv(K), a.repeat_kv(V))
        x = x + a.linear_out(a.merge_heads(out))
        x = x + blk.ff(blk.ln2(x))
    return m.head(m.ln_f(x))[:, -1]


@pytest.mark.parametrize("bug", ["position 0", "rotate twice"])
def test_negative_controls_rope_cache_bugs_change_the_output(bug):
    m = _model(kv=2)
    x = _prompt()
    _, good = m.generate(x, 12, return_logits=True)
    bad = _decode_with_bug(m, x, 12, bug)
    torch.testing.assert_close(bad[:, 0], good[:, 0])  # the first token comes from the prefill: not affected
    assert (bad[:, 1:] - good[:, 1:]).abs().max() > 0.05  # from the first cached step on, the logits are wrong
    assert not torch.equal(bad.argmax(-1), good.argmax(-1))  # and so are some tokens


def test_greedy_generate_with_zero_steps_and_the_function_form():
    m = _model()
    x = _prompt()
    toks, logits = greedy_generate(m, x, 0, return_logits=True)
    assert torch.equal(toks, x) and logits.shape == (3, 0, 16)
    assert torch.equal(greedy_generate(m, x, 7), m.generate(x, 7))


def test_generate_restores_training_mode():
    m = _model().train()
    m.generate(_prompt(), 2)
    assert m.training


def test_errors():
    m = _model(max_len=12)
    x = _prompt(n=5)
    with pytest.raises(ValueError, match=r"prompt length \+ max_new_tokens must be <= max_len=12, got 5 \+ 8 = 13"):
        m.generate(x, 8)
    with pytest.raises(ValueError, match=r"max_new_tokens must be >= 0, got -1"):
        m.generate(x, -1)
    for bad in (2.0, True):  # not an int (a bool is not a count): TypeError, from generate and greedy_generate alike
        for gen in (m.generate, lambda t, n: greedy_generate(m, t, n)):
            with pytest.raises(TypeError, match=rf"max_new_tokens must be an int, got {type(bad).__name__}"):
                gen(x, bad)
    with pytest.raises(TypeError, match="use_cache must be a bool, got str"):
        m.generate(x, 2, use_cache="yes")
    with pytest.raises(ValueError, match=r"tokens must be a \(batch, prompt_len\) tensor with prompt_len >= 1, got \(3, 0\)"):
        greedy_generate(m, x[:, :0], 2)
    enc = TinyTransformer(16, 32, 4, 2, 12, causal=False, seed=0)
    with pytest.raises(ValueError, match="generate needs causal=True"):
        enc.generate(x, 2)
    with pytest.raises(ValueError, match="cache needs causal=True"):
        enc(x, cache=KVCache(2))
    with pytest.raises(ValueError, match="cache must have num_layers=2 layers, got 3"):
        m(x, cache=KVCache(3))
    with pytest.raises(TypeError, match="cache must be a helpers.kvcache.KVCache, got dict"):
        m(x, cache={})
    with pytest.raises(ValueError, match="num_layers must be >= 1, got 0"):
        KVCache(0)
    with pytest.raises(TypeError, match="max_len must be an int, got float"):
        KVCache(1, max_len=4.0)
    cache = KVCache(2, max_len=6)
    k = torch.zeros(1, 2, 4, 8)
    cache.update(0, k, k)
    with pytest.raises(ValueError, match="the cache holds at most max_len=6 tokens; this update would make 8"):
        cache.update(0, k, k)
    with pytest.raises(ValueError, match=r"layer_idx must be in \[0, num_layers=2\), got 2"):
        cache.update(2, k, k)
    with pytest.raises(ValueError, match=r"new keys/values must match the cached"):
        cache.update(0, torch.zeros(1, 3, 1, 8), torch.zeros(1, 3, 1, 8))
    with pytest.raises(ValueError, match=r"key must be a \(batch, num_kv_heads, seq, head_dim\) tensor, got \(2, 8\)"):
        cache.update(1, torch.zeros(2, 8), k)
    with pytest.raises(ValueError, match="key and value must agree on"):
        cache.update(1, k, torch.zeros(1, 2, 3, 8))
    with pytest.raises(ValueError, match="must have the cache's dtype and device"):
        cache.update(0, torch.zeros(1, 2, 1, 8, dtype=torch.float64), torch.zeros(1, 2, 1, 8, dtype=torch.float64))
    mha = MultiHeadAttention(32, 4, rope=True)
    h = torch.randn(1, 3, 32)
    with pytest.raises(ValueError, match="with a cache, attention is self-attention over the cached tokens"):
        mha(h, h, cache=KVCache(1))
    with pytest.raises(ValueError, match=r"query must have shape \(batch, seq, d_model=32\), got \(3, 32\)"):
        mha(h[0], cache=KVCache(1))
    with pytest.raises(TypeError, match=r"cache must be a KV cache with update\(layer_idx, key, value\)"):
        mha(h, cache={})
    with pytest.raises(ValueError, match=r"mask of shape \(3, 4\) is not broadcastable .* = \(1, 4, 3, 3\)"):
        mha(h, cache=KVCache(1), mask=torch.ones(3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="positions are only used with rope=True"):
        MultiHeadAttention(32, 4)(h, cache=KVCache(1), positions=torch.arange(3))
    with pytest.raises(ValueError, match="seq_len must be >= 0, got -1"):
        kv_cache_bytes(1, 1, 8, -1)
    with pytest.raises(TypeError, match="dtype must be a torch.dtype"):
        kv_cache_bytes(1, 1, 8, 4, dtype="bf16")


def test_update_refuses_a_value_of_another_dtype():
    from helpers.kvcache import KVCache

    cache = KVCache(num_layers=1)
    k = torch.randn(1, 2, 3, 4)
    cache.update(0, k, k.clone())
    with pytest.raises(ValueError, match="new values must have the cache's dtype"):
        cache.update(0, torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4, dtype=torch.float64))
