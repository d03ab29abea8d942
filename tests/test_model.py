"""Tests of helpers.model: sinusoidal encoding and the TinyTransformer."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.model import POSITIONAL_ENCODINGS, TinyTransformer, alibi_bias, alibi_slopes, sinusoidal_encoding

SETTINGS = settings(max_examples=20, deadline=None)
V, D, H, L, MAXLEN = 11, 16, 2, 2, 12


def _model(pos="rope", **kw):
    return TinyTransformer(V, D, H, L, MAXLEN, pos=pos, seed=0, **kw).eval()


def _tokens(b=3, n=8, seed=0):
    return torch.randint(0, V, (b, n), generator=torch.Generator().manual_seed(seed))


def test_sinusoidal_encoding_formula():
    pe = sinusoidal_encoding(50, 8)
    assert pe.shape == (50, 8) and pe.dtype == torch.float32
    p, i = 7, 1
    torch.testing.assert_close(pe[p, 2 * i], torch.tensor(math.sin(p / 10000 ** (2 * i / 8))))
    torch.testing.assert_close(pe[p, 2 * i + 1], torch.tensor(math.cos(p / 10000 ** (2 * i / 8))))
    torch.testing.assert_close(sinusoidal_encoding(torch.tensor([[3, 4]]), 8), pe[3:5][None])
    with pytest.raises(ValueError, match=r"d_model must be even for the sinusoidal encoding .* got 7"):
        sinusoidal_encoding(4, 7)


@pytest.mark.parametrize("pos", POSITIONAL_ENCODINGS)
@pytest.mark.parametrize("norm", ["pre", "post"])
def test_forward_shapes_and_attention_weights(pos, norm):
    model = _model(pos, norm=norm)
    logits = model(_tokens())
    assert logits.shape == (3, 8, V)
    assert len(model.attention_weights) == L
    for w in model.attention_weights:
        assert w.shape == (3, H, 8, 8) and not w.requires_grad
        torch.testing.assert_close(w.sum(-1), torch.ones(3, H, 8))
        assert torch.equal(w.triu(1), torch.zeros_like(w))  # causal
    model(_tokens(), need_weights=False)
    assert model.attention_weights == []


def test_not_causal_attends_everywhere():
    model = _model("learned", causal=False)
    model(_tokens())
    assert (model.attention_weights[0].triu(1) > 0).any()


@SETTINGS
@given(pos=st.sampled_from(POSITIONAL_ENCODINGS), t=st.integers(0, 6), seed=st.integers(0, 100))
def test_causal_logits_ignore_future_tokens(pos, t, seed):
    model = _model(pos)
    x = _tokens(2, 8, seed)
    y = x.clone()
    y[:, t + 1 :] = (y[:, t + 1 :] + 1) % V
    with torch.no_grad():
        torch.testing.assert_close(model(x)[:, : t + 1], model(y)[:, : t + 1])


@pytest.mark.parametrize("pos,invariant", [("rope", True), ("none", True), ("sinusoidal", False), ("learned", False)])
def test_offset_shift_invariance(pos, invariant):
    model = _model(pos)
    x = _tokens()
    with torch.no_grad():
        base = model(x)
        shifted = model(x, offset=3)
        torch.testing.assert_close(model(x, positions=torch.arange(8) + 3), shifted)
        torch.testing.assert_close(model(x, positions=(torch.arange(8) + 3).expand(3, 8)), shifted)
    assert torch.allclose(shifted, base, atol=1e-4) == invariant


@pytest.mark.parametrize("pos", ["rope", "sinusoidal", "learned"])
def test_batch_seq_positions_are_per_example(pos):
    """(batch, seq) positions: example b is encoded with row b in every layer and head.
    batch == num_heads (= 2) and scrambled positions, so a wrong pairing cannot hide."""
    model = _model(pos).double()
    x = _tokens(2, 6, seed=3)
    positions = torch.tensor([[4, 0, 9, 1, 7, 2], [11, 3, 3, 0, 8, 5]])
    with torch.no_grad():
        out = model(x, positions=positions)
        ref = torch.cat([model(x[b : b + 1], positions=positions[b]) for b in range(2)])
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
        assert (out - model(x, positions=positions[0])).abs().max() > 1e-3


@pytest.mark.parametrize("pos", ["none", "sinusoidal", "rope"])
def test_beyond_max_len_works(pos):
    logits = _model(pos)(_tokens(2, 2 * MAXLEN))
    assert logits.shape == (2, 2 * MAXLEN, V) and torch.isfinite(logits).all()


def test_learned_beyond_max_len_raises():
    model = _model("learned")
    with pytest.raises(ValueError, match=r"pos='learned' has a table for positions 0 \.\. max_len-1 = 11 \(max_len=12\); "
                                         r"got positions in \[0, 12\] \(seq=13\)"):
        model(_tokens(1, 13))
    with pytest.raises(ValueError, match=r"max_len=12.*got positions in \[5, 12\]"):
        model(_tokens(1, 8), offset=5)
    with pytest.raises(ValueError, match=r"needs integer positions"):
        model(_tokens(1, 4), positions=torch.arange(4) * 0.5)


def test_head_mask_per_layer_and_gradient():
    model = _model("rope")
    x = _tokens()
    with torch.no_grad():
        base = model(x)
        torch.testing.assert_close(model(x, head_mask=torch.ones(L, H)), base)
        hm = torch.ones(L, H)
        hm[1, 0] = 0
        pruned = model(x, head_mask=hm)
        assert not torch.allclose(pruned, base)
        per_batch = torch.ones(3, L, H)
        per_batch[1] = hm
        out_b = model(x, head_mask=per_batch)
        torch.testing.assert_close(out_b[1], pruned[1])
        torch.testing.assert_close(out_b[0], base[0])
    # Michel et al. (2019): importance = |dL/dm| for a head mask of ones
    hm = torch.ones(L, H, requires_grad=True)
    model(x, head_mask=hm).logsumexp(-1).mean().backward()
    assert hm.grad.shape == (L, H) and (hm.grad != 0).all()


def test_seed_makes_init_reproducible_without_touching_global_rng():
    state = torch.random.get_rng_state()
    a = TinyTransformer(V, D, H, L, MAXLEN, seed=3)
    assert torch.equal(torch.random.get_rng_state(), state)
    b = TinyTransformer(V, D, H, L, MAXLEN, seed=3)
    c = TinyTransformer(V, D, H, L, MAXLEN, seed=4)
    for (n, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), n
    assert not torch.equal(a.tok_emb.weight, c.tok_emb.weight)


def test_residual_dropout():
    model = _model("rope", dropout=0.3)
    x = _tokens()
    with torch.no_grad():
        torch.testing.assert_close(model(x), model(x))
        model.train()
        torch.manual_seed(0)
        a = model(x)
        b = model(x)
    assert not torch.allclose(a, b)
    assert all(blk.drop.p == 0.3 for blk in model.blocks) and model.drop.p == 0.3


def test_model_errors():
    with pytest.raises(ValueError, match=r"pos must be one of \('none', 'sinusoidal', 'learned', 'rope', 'alibi'\), got 'xpos'"):
        TinyTransformer(V, D, H, L, MAXLEN, pos="xpos")
    with pytest.raises(ValueError, match=r"pos='sinusoidal' needs an even d_model, got 15"):
        TinyTransformer(V, 15, 3, L, MAXLEN, pos="sinusoidal")
    with pytest.raises(ValueError, match=r"d_model must be divisible by num_heads, got d_model=16, num_heads=3"):
        TinyTransformer(V, 16, 3, L, MAXLEN, pos="none")
    with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\), got 1"):
        TinyTransformer(V, D, H, L, MAXLEN, dropout=1)
    with pytest.raises(ValueError, match=r"num_layers must be >= 1, got 0"):
        TinyTransformer(V, D, H, 0, MAXLEN)
    with pytest.raises(ValueError, match=r"norm must be 'pre' or 'post', got 'sandwich'"):
        TinyTransformer(V, D, H, L, MAXLEN, norm="sandwich")
    model = _model()
    with pytest.raises(ValueError, match=r"tokens must be in \[0, vocab_size=11\), got values in \[0, 11\]"):
        model(torch.tensor([[0, 11]]))
    with pytest.raises(TypeError, match=r"tokens must be an integer tensor, got dtype torch.float32"):
        model(torch.zeros(1, 3))
    with pytest.raises(ValueError, match=r"tokens must have shape \(batch, seq\), got \(3,\)"):
        model(torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"head_mask must have shape \(num_layers, num_heads\) = \(2, 2\) or "
                                         r"\(batch, num_layers, num_heads\) = \(3, 2, 2\), got \(2,\)"):
        model(_tokens(), head_mask=torch.ones(2))
    with pytest.raises(ValueError, match=r"positions must have shape \(seq,\) = \(8,\) or \(batch, seq\) = \(3, 8\), got \(7,\)"):
        model(_tokens(), positions=torch.arange(7))


@pytest.mark.parametrize("pos", POSITIONAL_ENCODINGS)
def test_float64_model(pos):
    model = _model(pos).double()
    logits = model(_tokens(), offset=2 if pos != "learned" else 0)
    assert logits.dtype == torch.float64 and model.attention_weights[0].dtype == torch.float64


# ---------------------------------------------------------------- ALiBi (Press et al. 2022)
def _authors_get_slopes(n):
    # get_slopes of ofirpress/attention_with_linear_biases (fairseq/models/transformer.py), restated
    def power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    p = 2 ** math.floor(math.log2(n))
    return power_of_2(p) + _authors_get_slopes(2 * p)[0::2][: n - p]


@pytest.mark.parametrize("n", list(range(1, 33)))
def test_alibi_slopes_match_the_authors_rule(n):
    torch.testing.assert_close(alibi_slopes(n), torch.tensor(_authors_get_slopes(n), dtype=torch.float64),
                               rtol=1e-12, atol=0)


def test_alibi_slopes_values():
    # the paper (sec. 3): 8 heads -> 1/2, 1/4, ..., 1/256
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0 ** -k for k in range(1, 9)], dtype=torch.float64))
    torch.testing.assert_close(alibi_slopes(2), torch.tensor([2.0 ** -4, 2.0 ** -8], dtype=torch.float64))
    # 6 heads: the 4 of 4 heads, then slopes 1 and 3 of 8 heads
    torch.testing.assert_close(alibi_slopes(6), torch.tensor([2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8, 2.0 ** -1, 2.0 ** -3],
                                                             dtype=torch.float64))
    with pytest.raises(ValueError, match=r"num_heads must be >= 1, got 0"):
        alibi_slopes(0)


def test_alibi_bias_shape_values_and_causality():
    slopes = torch.tensor([0.5, 0.25], dtype=torch.float64)
    b = alibi_bias(torch.arange(5), slopes)
    assert b.shape == (2, 5, 5) and b.dtype == torch.float32
    for h in range(2):
        for i in range(5):
            for j in range(5):
                want = -slopes[h].item() * (i - j) if j <= i else float("-inf")
                assert b[h, i, j].item() == want
    bb = alibi_bias(torch.arange(5).repeat(3, 1) + torch.arange(3)[:, None] * 7, slopes)
    assert bb.shape == (3, 2, 5, 5)
    torch.testing.assert_close(bb, b.expand(3, -1, -1, -1))  # a shift changes nothing
    with pytest.raises(ValueError, match=r"positions must be a \(seq,\) or \(batch, seq\) tensor, got \(1, 2, 3\)"):
        alibi_bias(torch.zeros(1, 2, 3), slopes)
    with pytest.raises(ValueError, match=r"slopes must be a \(heads,\) tensor, got \(2, 1\)"):
        alibi_bias(torch.arange(4), slopes[:, None])


def test_alibi_model_equals_a_manual_computation():
    torch.manual_seed(0)
    model = TinyTransformer(V, D, H, 1, MAXLEN, pos="alibi", seed=3).double()
    x = _tokens()
    logits = model(x)
    blk = model.blocks[0]
    h = blk.ln1(model.tok_emb(x))  # no position added to the input
    attn = blk.attn
    q, k, v = (attn.split_heads(f(h)) for f in (attn.linear_q, attn.linear_k, attn.linear_v))
    n = x.shape[1]
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    m = torch.tensor(_authors_get_slopes(H), dtype=torch.float64)[:, None, None]
    scores = q @ k.transpose(-2, -1) / math.sqrt(attn.head_dim) - m * (i - j)
    w = torch.softmax(scores.masked_fill(j > i, float("-inf")), dim=-1)
    torch.testing.assert_close(model.attention_weights[0], w)
    a = attn.linear_out(attn.merge_heads(w @ v))
    y = model.tok_emb(x) + a
    y = y + blk.ff(blk.ln2(y))
    torch.testing.assert_close(logits, model.head(model.ln_f(y)))
    # the fused path (need_weights=False) gives the same logits
    torch.testing.assert_close(model(x, need_weights=False), logits)


def test_alibi_model_is_causal_and_shift_invariant():
    model = TinyTransformer(V, D, H, 2, MAXLEN, pos="alibi", seed=1).double()
    x = _tokens()
    y = model(x)
    x2 = x.clone()
    x2[:, 5:] = (x2[:, 5:] + 1) % V  # change the future of position 4
    torch.testing.assert_close(model(x2)[:, :5], y[:, :5])
    torch.testing.assert_close(model(x, offset=1000), y)  # scores depend on i - j only
    assert model.attention_weights[0].shape == (x.shape[0], H, x.shape[1], x.shape[1])
    with pytest.raises(ValueError, match=r"pos='alibi' needs causal=True"):
        TinyTransformer(V, D, H, 1, MAXLEN, pos="alibi", causal=False)
