"""Tests of grouped-query / multi-query attention: the ``num_kv_heads`` option of
helpers.attention.MultiHeadAttention and helpers.model.TinyTransformer (notebook 05)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.attention import MultiHeadAttention, causal_mask
from helpers.model import TinyTransformer

SETTINGS = settings(max_examples=20, deadline=None)


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _mha(d=16, h=4, g=None, seed=0, **kw):
    torch.manual_seed(seed)
    return MultiHeadAttention(d, h, num_kv_heads=g, **kw).eval()


def test_default_is_plain_multi_head_attention():
    a, b = _mha(g=None), _mha(g=4)
    assert a.num_kv_heads == 4 and a.linear_k.weight.shape == (16, 16)
    assert {k: v.shape for k, v in a.state_dict().items()} == {k: v.shape for k, v in b.state_dict().items()}
    x = _randn(2, 5, 16)
    with torch.no_grad():
        torch.testing.assert_close(a(x)[0], b(x)[0])
    assert "num_kv_heads" not in repr(a) and "num_kv_heads=2" in repr(_mha(g=2))


@pytest.mark.parametrize("g", [1, 2, 4])
def test_projection_shapes_and_parameter_count(g):
    d, h = 16, 4
    mha = _mha(d, h, g)
    dk = d // h
    assert mha.linear_q.weight.shape == (d, d) and mha.linear_out.weight.shape == (d, d)
    assert mha.linear_k.weight.shape == (g * dk, d) and mha.linear_v.weight.shape == (g * dk, d)
    n_params = sum(p.numel() for p in mha.parameters())
    assert n_params == 2 * (d * d + d) + 2 * (d * g * dk + g * dk)


def test_repeat_kv_matches_hugging_face_layout():
    mha = _mha(16, 4, 2)
    kv = _randn(3, 2, 5, 4)  # (batch, kv heads, seq, head_dim)
    rep = mha.repeat_kv(kv)
    assert rep.shape == (3, 4, 5, 4)
    # query heads 0, 1 share K/V head 0; heads 2, 3 share K/V head 1 (repeat_interleave, not tile)
    torch.testing.assert_close(rep, kv.repeat_interleave(2, dim=1))
    assert torch.equal(rep[:, 0], rep[:, 1]) and torch.equal(rep[:, 2], rep[:, 3]) and not torch.equal(rep[:, 1], rep[:, 2])
    assert _mha(16, 4, 4).repeat_kv(_randn(1, 4, 2, 4)).shape == (1, 4, 2, 4)


@SETTINGS
@given(g=st.sampled_from([1, 2, 4]), n=st.integers(1, 7), rope=st.booleans(), seed=st.integers(0, 50))
def test_matches_torch_sdpa_with_enable_gqa(g, n, rope, seed):
    """Reference: torch's own grouped-query attention (F.scaled_dot_product_attention(enable_gqa=True))."""
    mha = _mha(16, 4, g, seed=seed, rope=rope)
    x = _randn(2, n, 16, seed=seed)
    mask = causal_mask(n)
    with torch.no_grad():
        out, w = mha(x, mask=mask)
        out_fused, w_none = mha(x, mask=mask, need_weights=False)
        q = mha.split_heads(mha.linear_q(x))
        k = mha.linear_k(x).view(2, n, g, 4).transpose(1, 2)
        v = mha.linear_v(x).view(2, n, g, 4).transpose(1, 2)
        if rope:
            from helpers.rope import apply_rope
            q, k = apply_rope(q, None), apply_rope(k, None)
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        ref = mha.linear_out(ref.transpose(1, 2).reshape(2, n, 16))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out_fused, ref, atol=1e-5, rtol=1e-5)
    assert w.shape == (2, 4, n, n) and w_none is None


def test_equals_multi_head_attention_with_repeated_kv_weights():
    """A GQA module is an MHA module whose K/V weight rows are repeated per group."""
    d, h, g = 16, 4, 2
    gqa = _mha(d, h, g)
    mha = _mha(d, h, None, seed=1)
    dk = d // h
    idx = torch.cat([torch.arange(j * dk, (j + 1) * dk) for j in range(g) for _ in range(h // g)])
    with torch.no_grad():
        for name in ("linear_q", "linear_out"):
            getattr(mha, name).load_state_dict(getattr(gqa, name).state_dict())
        for name in ("linear_k", "linear_v"):
            getattr(mha, name).weight.copy_(getattr(gqa, name).weight[idx])
            getattr(mha, name).bias.copy_(getattr(gqa, name).bias[idx])
        x = _randn(3, 6, d)
        out_g, w_g = gqa(x, mask=causal_mask(6))
        out_m, w_m = mha(x, mask=causal_mask(6))
    torch.testing.assert_close(out_g, out_m)
    torch.testing.assert_close(w_g, w_m)
    # heads of one group share keys, so they differ only through their queries
    assert not torch.allclose(w_g[:, 0], w_g[:, 1])


def test_multi_query_heads_share_one_value_and_head_mask_still_prunes():
    mha = _mha(16, 4, 1)
    x = _randn(2, 5, 16)
    hm = torch.tensor([1.0, 0.0, 1.0, 1.0])
    with torch.no_grad():
        full, _ = mha(x)
        pruned, _ = mha(x, head_mask=hm)
    assert not torch.allclose(full, pruned)
    xi = torch.ones(4, requires_grad=True)
    mha(x, head_mask=xi)[0].pow(2).sum().backward()
    assert xi.grad.shape == (4,) and (xi.grad != 0).all()


def test_tiny_transformer_passes_num_kv_heads_and_stays_causal():
    model = TinyTransformer(11, 16, 4, 2, 12, seed=0, num_kv_heads=2).eval()
    assert model.num_kv_heads == 2
    assert all(b.attn.num_kv_heads == 2 and b.attn.linear_k.out_features == 8 for b in model.blocks)
    full = TinyTransformer(11, 16, 4, 2, 12, seed=0).eval()
    assert full.num_kv_heads == 4
    n_gqa = sum(p.numel() for p in model.parameters())
    n_full = sum(p.numel() for p in full.parameters())
    assert n_full - n_gqa == 2 * 2 * (16 * 8 + 8)  # 2 layers x (K and V) x the removed half
    x = torch.randint(0, 11, (2, 8), generator=torch.Generator().manual_seed(0))
    y = x.clone()
    y[:, 5:] = (y[:, 5:] + 1) % 11
    with torch.no_grad():
        torch.testing.assert_close(model(x)[:, :5], model(y)[:, :5])
    assert model.attention_weights[0].shape == (2, 4, 8, 8)


def test_errors():
    with pytest.raises(ValueError, match=r"num_heads must be divisible by num_kv_heads .* got num_heads=4, num_kv_heads=3"):
        MultiHeadAttention(16, 4, num_kv_heads=3)
    with pytest.raises(ValueError, match=r"num_kv_heads must be >= 1, got 0"):
        MultiHeadAttention(16, 4, num_kv_heads=0)
    with pytest.raises(TypeError, match=r"num_kv_heads must be an int, got float"):
        MultiHeadAttention(16, 4, num_kv_heads=2.0)
    with pytest.raises(ValueError, match=r"num_heads must be divisible by num_kv_heads .* num_kv_heads=8"):
        TinyTransformer(11, 16, 4, 1, 12, num_kv_heads=8)
