"""Tests of helpers.attention: the mask, scaled dot-product attention, MultiHeadAttention."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.attention import MultiHeadAttention, causal_mask, scaled_dot_product_attention
from helpers.rope import apply_rope, interleaved_to_half_index

SETTINGS = settings(max_examples=20, deadline=None)


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=_gen(seed), dtype=dtype)


def _torch_and_ours(d_model, heads, bias=True, seed=0):
    torch.manual_seed(seed)
    ref = torch.nn.MultiheadAttention(d_model, heads, bias=bias, batch_first=True).eval()
    if bias:  # torch initialises biases to zero: make them visible
        with torch.no_grad():
            ref.in_proj_bias.uniform_(-0.5, 0.5)
            ref.out_proj.bias.uniform_(-0.5, 0.5)
    return ref, MultiHeadAttention.from_torch(ref).eval()


# ------------------------------------------------------------------------ causal_mask
def test_causal_mask_values():
    m = causal_mask(4)
    assert m.dtype == torch.bool and m.shape == (4, 4)
    assert torch.equal(m, torch.ones(4, 4, dtype=torch.bool).tril())
    assert m[2, 1] and m[2, 2] and not m[1, 2]  # query i sees key j iff j <= i


def test_causal_mask_errors():
    with pytest.raises(ValueError, match=r"seq_len must be >= 1, got 0"):
        causal_mask(0)
    with pytest.raises(TypeError, match=r"seq_len must be an int, got float"):
        causal_mask(3.0)


# ------------------------------------------------------------ scaled dot-product
@SETTINGS
@given(
    lead=st.lists(st.integers(1, 3), min_size=0, max_size=2),
    n_q=st.integers(1, 6),
    n_k=st.integers(1, 6),
    d_k=st.integers(1, 8),
    d_v=st.integers(1, 8),
    mask_kind=st.sampled_from(["none", "bool", "float", "causal"]),
    seed=st.integers(0, 1000),
)
def test_sdpa_matches_torch(lead, n_q, n_k, d_k, d_v, mask_kind, seed):
    g = _gen(seed)
    q = torch.randn(*lead, n_q, d_k, generator=g)
    k = torch.randn(*lead, n_k, d_k, generator=g)
    v = torch.randn(*lead, n_k, d_v, generator=g)
    mask = None
    if mask_kind == "bool":
        mask = torch.rand(n_q, n_k, generator=g) > 0.3
        mask[:, 0] = True  # torch < 2.5 returned NaN on fully masked rows; keep rows alive here
    elif mask_kind == "float":
        mask = torch.randn(*lead, n_q, n_k, generator=g)
    elif mask_kind == "causal" and n_q == n_k:
        mask = causal_mask(n_q)
    out, w = scaled_dot_product_attention(q, k, v, mask=mask)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert w.shape == (*lead, n_q, n_k)
    torch.testing.assert_close(w.sum(-1), torch.ones(*lead, n_q))


def test_sdpa_formula_and_scale():
    q, k, v = _randn(2, 3, 4, seed=1), _randn(2, 5, 4, seed=2), _randn(2, 5, 6, seed=3)
    w_expected = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(4), dim=-1)
    out, w = scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(w, w_expected)
    torch.testing.assert_close(out, w_expected @ v)
    _, w1 = scaled_dot_product_attention(q, k, v, scale=1.0)
    torch.testing.assert_close(w1, torch.softmax(q @ k.transpose(-1, -2), dim=-1))


def test_sdpa_fully_masked_row_is_zero_not_nan():
    q, k, v = _randn(1, 3, 4), _randn(1, 3, 4, seed=1), _randn(1, 3, 4, seed=2)
    q.requires_grad_(True)
    mask = torch.tensor([[True, False, False], [False, False, False], [True, True, True]])
    out, w = scaled_dot_product_attention(q, k, v, mask=mask)
    assert torch.equal(out[0, 1], torch.zeros(4)) and torch.equal(w[0, 1], torch.zeros(3))
    assert not torch.isnan(out).any()
    out.sum().backward()
    assert torch.isfinite(q.grad).all()
    # the same choice as F.scaled_dot_product_attention, and the float -inf form agrees
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    fmask = torch.zeros(3, 3).masked_fill(~mask, float("-inf"))
    torch.testing.assert_close(scaled_dot_product_attention(q, k, v, mask=fmask)[0], out)



@pytest.mark.parametrize("mask_kind", ["bool", "float"])
def test_sdpa_and_mha_with_a_mask_on_meta(mask_kind):
    # REVIEW check 10: shapes propagate on the meta device with a mask too (no Tensor.item()).
    q, k, v = (torch.empty(2, 4, 5, 8, device="meta") for _ in range(3))
    mask = causal_mask(5, device="meta")
    if mask_kind == "float":
        mask = torch.zeros(5, 5, device="meta").masked_fill(~mask, float("-inf"))
    out, w = scaled_dot_product_attention(q, k, v, mask=mask)
    assert out.device.type == "meta" and out.shape == (2, 4, 5, 8) and w.shape == (2, 4, 5, 5)
    mha = MultiHeadAttention(16, 4).to("meta")
    x = torch.empty(2, 5, 16, device="meta")
    for need_weights in (True, False):
        y, wy = mha(x, mask=causal_mask(5, device="meta"), need_weights=need_weights)
        assert y.device.type == "meta" and y.shape == (2, 5, 16)
        assert (wy.shape == (2, 4, 5, 5)) if need_weights else wy is None
    # and on a real device the zeroing branch gives the same numbers as before (dead row -> 0)
    real = torch.tensor([[True, False], [False, False]])
    qr = _randn(1, 2, 3)
    out_r, w_r = scaled_dot_product_attention(qr, qr, qr, mask=real)
    assert torch.equal(w_r[0, 1], torch.zeros(2)) and torch.equal(w_r[0, 0], torch.tensor([1.0, 0.0]))

def test_sdpa_dropout():
    q, k, v = _randn(2, 8, 4), _randn(2, 8, 4, seed=1), _randn(2, 8, 4, seed=2)
    out0, w0 = scaled_dot_product_attention(q, k, v)
    out_eval, _ = scaled_dot_product_attention(q, k, v, dropout_p=0.5, training=False)
    torch.testing.assert_close(out_eval, out0)
    torch.manual_seed(0)
    out_tr, w_tr = scaled_dot_product_attention(q, k, v, dropout_p=0.5, training=True)
    assert not torch.allclose(out_tr, out0)
    torch.testing.assert_close(w_tr, w0)  # weights are returned before dropout


def test_sdpa_errors():
    q, k, v = _randn(2, 3, 4), _randn(2, 5, 4), _randn(2, 5, 6)
    with pytest.raises(ValueError, match=r"mask of shape \(4, 5\) is not broadcastable to the attention scores of shape .*\(2, 3, 5\)"):
        scaled_dot_product_attention(q, k, v, mask=torch.ones(4, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match=r"mask must be a bool tensor .* got dtype torch.int64"):
        scaled_dot_product_attention(q, k, v, mask=torch.ones(3, 5, dtype=torch.long))
    with pytest.raises(ValueError, match=r"dropout_p must be in \[0, 1\), got 1.0"):
        scaled_dot_product_attention(q, k, v, dropout_p=1.0)
    with pytest.raises(ValueError, match=r"q and k must have the same last dimension d_k"):
        scaled_dot_product_attention(q, _randn(2, 5, 3), v)
    with pytest.raises(ValueError, match=r"k and v must have the same number of keys"):
        scaled_dot_product_attention(q, k, _randn(2, 4, 6))
    with pytest.raises(TypeError, match=r"q must be a torch.Tensor, got list"):
        scaled_dot_product_attention([1.0], k, v)


# ------------------------------------------------------------ MultiHeadAttention
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(
    "batch,n_q,n_k,d_model,heads,mask_kind",
    [
        (2, 5, 5, 16, 4, "none"),
        (2, 5, 5, 16, 4, "causal"),
        (3, 4, 7, 24, 3, "bool"),
        (1, 6, 6, 8, 1, "float"),
        (2, 7, 3, 32, 8, "padding"),
    ],
)
def test_mha_equals_torch(batch, n_q, n_k, d_model, heads, mask_kind, bias):
    ref, ours = _torch_and_ours(d_model, heads, bias=bias)
    g = _gen(1)
    q = torch.randn(batch, n_q, d_model, generator=g)
    k = torch.randn(batch, n_k, d_model, generator=g)
    v = torch.randn(batch, n_k, d_model, generator=g)
    ours_mask, kw = None, {}
    if mask_kind == "causal":
        ours_mask = causal_mask(n_q)
        kw = {"attn_mask": ~ours_mask}  # torch: True = blocked
    elif mask_kind == "bool":
        ours_mask = torch.rand(n_q, n_k, generator=g) > 0.4
        ours_mask[:, 0] = True
        kw = {"attn_mask": ~ours_mask}
    elif mask_kind == "float":
        ours_mask = torch.randn(n_q, n_k, generator=g)
        kw = {"attn_mask": ours_mask}
    elif mask_kind == "padding":
        keep = torch.ones(batch, n_k, dtype=torch.bool)
        keep[0, -1] = False
        ours_mask = keep[:, None, None, :]  # (batch, 1, 1, seq_k)
        kw = {"key_padding_mask": ~keep}
    with torch.no_grad():
        out_t, w_t = ref(q, k, v, need_weights=True, average_attn_weights=False, **kw)
        out, w = ours(q, k, v, mask=ours_mask)
        out_fused, w_none = ours(q, k, v, mask=ours_mask, need_weights=False)
    torch.testing.assert_close(out, out_t, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(w, w_t, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(out_fused, out_t, atol=1e-5, rtol=1e-4)
    assert w.shape == (batch, heads, n_q, n_k) and w_none is None


def test_mha_self_attention_defaults_and_float64():
    ref, ours = _torch_and_ours(12, 3)
    ref, ours = ref.double(), ours.double()
    x = _randn(2, 5, 12, dtype=torch.float64)
    out, w = ours(x)
    assert out.dtype == torch.float64 and w.dtype == torch.float64
    torch.testing.assert_close(out, ref(x, x, x)[0], atol=1e-12, rtol=1e-10)


def test_from_torch_details():
    torch.manual_seed(0)
    seq_first = torch.nn.MultiheadAttention(8, 2, dropout=0.25, batch_first=False).double().train()
    ours = MultiHeadAttention.from_torch(seq_first)
    assert ours.dropout == 0.25 and ours.training and ours.linear_q.weight.dtype == torch.float64
    x = _randn(3, 4, 8, dtype=torch.float64)  # (batch, seq, d)
    seq_first.eval(), ours.eval()
    expected = seq_first(x.transpose(0, 1), x.transpose(0, 1), x.transpose(0, 1))[0].transpose(0, 1)
    torch.testing.assert_close(ours(x)[0], expected)
    no_bias = MultiHeadAttention.from_torch(torch.nn.MultiheadAttention(8, 2, bias=False))
    assert no_bias.linear_q.bias is None and no_bias.linear_out.bias is None


def test_from_torch_errors():
    with pytest.raises(TypeError, match=r"module must be a torch.nn.MultiheadAttention, got Linear"):
        MultiHeadAttention.from_torch(torch.nn.Linear(4, 4))
    with pytest.raises(ValueError, match=r"kdim == vdim == embed_dim, got embed_dim=8, kdim=4, vdim=8"):
        MultiHeadAttention.from_torch(torch.nn.MultiheadAttention(8, 2, kdim=4))
    with pytest.raises(ValueError, match=r"add_bias_kv or add_zero_attn"):
        MultiHeadAttention.from_torch(torch.nn.MultiheadAttention(8, 2, add_bias_kv=True))


@SETTINGS
@given(n=st.integers(2, 8), t=st.integers(0, 7), seed=st.integers(0, 1000), rope=st.booleans())
def test_causal_outputs_ignore_future(n, t, seed, rope):
    t = t % n
    torch.manual_seed(seed)
    mha = MultiHeadAttention(16, 4, rope=rope).eval()
    g = _gen(seed)
    x = torch.randn(2, n, 16, generator=g)
    y = x.clone()
    y[:, t + 1 :] = torch.randn(2, n - t - 1, 16, generator=g)  # change the future of t
    with torch.no_grad():
        a, _ = mha(x, mask=causal_mask(n))
        b, _ = mha(y, mask=causal_mask(n))
    torch.testing.assert_close(a[:, : t + 1], b[:, : t + 1])


@SETTINGS
@given(n=st.integers(1, 8), seed=st.integers(0, 1000))
def test_permutation_equivariance_without_mask_or_positions(n, seed):
    torch.manual_seed(seed)
    mha = MultiHeadAttention(16, 4).eval()
    g = _gen(seed)
    x = torch.randn(2, n, 16, generator=g)
    perm = torch.randperm(n, generator=g)
    with torch.no_grad():
        out, w = mha(x)
        out_p, w_p = mha(x[:, perm])
    torch.testing.assert_close(out_p, out[:, perm], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(w_p, w[:, :, perm][:, :, :, perm], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("head", [0, 2, 3])
def test_head_mask_zero_equals_removing_the_head(head):
    torch.manual_seed(0)
    d, h = 16, 4
    dk = d // h
    mha = MultiHeadAttention(d, h).eval()
    x = _randn(2, 5, d)
    hm = torch.ones(h)
    hm[head] = 0.0
    with torch.no_grad():
        out, _ = mha(x, head_mask=hm)
        # Remove the head: its slice of the concatenation and the matching columns of W^O.
        q, k, v = (mha.split_heads(lin(x)) for lin in (mha.linear_q, mha.linear_k, mha.linear_v))
        heads, _ = scaled_dot_product_attention(q, k, v)  # (b, h, n, dk)
        keep = [i for i in range(h) if i != head]
        concat = heads[:, keep].transpose(1, 2).reshape(2, 5, (h - 1) * dk)
        cols = torch.cat([torch.arange(i * dk, (i + 1) * dk) for i in keep])
        expected = concat @ mha.linear_out.weight[:, cols].T + mha.linear_out.bias
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)


def test_head_mask_shapes_and_gradient():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4).eval()
    x = _randn(3, 5, 16)
    with torch.no_grad():
        plain, _ = mha(x)
        torch.testing.assert_close(mha(x, head_mask=torch.ones(4))[0], plain)
        per_batch = torch.tensor([[1.0, 1, 1, 1], [0, 1, 1, 1], [1, 1, 0.5, 0]])
        out_b, _ = mha(x, head_mask=per_batch)
        for i in range(3):
            torch.testing.assert_close(out_b[i : i + 1], mha(x[i : i + 1], head_mask=per_batch[i])[0])
    hm = torch.ones(4, requires_grad=True)
    mha(x, head_mask=hm, need_weights=False)[0].pow(2).sum().backward()
    assert hm.grad is not None and hm.grad.shape == (4,) and (hm.grad != 0).all()


def test_rope_per_head_and_shift_invariance():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 2, rope=True).eval()
    x = _randn(2, 6, 16)
    with torch.no_grad():
        out, w = mha(x, mask=causal_mask(6))
        q = apply_rope(mha.split_heads(mha.linear_q(x)))
        k = apply_rope(mha.split_heads(mha.linear_k(x)))
        v = mha.split_heads(mha.linear_v(x))
        o, w_ref = scaled_dot_product_attention(q, k, v, mask=causal_mask(6))
        torch.testing.assert_close(w, w_ref)
        torch.testing.assert_close(out, mha.linear_out(mha.merge_heads(o)))
        # RoPE scores depend only on relative positions: shifting all positions changes nothing.
        shifted, _ = mha(x, mask=causal_mask(6), positions=torch.arange(6) + 11)
        torch.testing.assert_close(shifted, out, atol=1e-5, rtol=1e-4)
        per_batch = torch.stack([torch.arange(6), torch.arange(6) + 3])
        torch.testing.assert_close(mha(x, mask=causal_mask(6), positions=per_batch)[0], out, atol=1e-5, rtol=1e-4)
        # ... but squeezing them (position interpolation) does
        squeezed, _ = mha(x, mask=causal_mask(6), positions=torch.arange(6) * 0.5)
        assert not torch.allclose(squeezed, out, atol=1e-4)


@pytest.mark.parametrize("num_kv_heads", [None, 1])
@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_rope_batch_seq_positions_are_per_example(num_kv_heads, layout):
    """(batch, seq) positions: example b uses row b in every head (batch == heads here, the
    case where broadcasting row b onto head b would go unnoticed by shapes). Scrambled,
    non-arithmetic positions, so shift invariance cannot hide a wrong pairing."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 2, rope=True, rope_layout=layout, num_kv_heads=num_kv_heads).eval().double()
    x = _randn(2, 5, 16, dtype=torch.float64)
    mem = _randn(2, 7, 16, seed=1, dtype=torch.float64)
    pos = torch.tensor([[3, 0, 9, 1, 4], [20, 2, 2, 7, 13]])
    kpos = torch.tensor([[0, 5, 1, 8, 2, 2, 6], [11, 3, 0, 4, 9, 1, 30]])
    with torch.no_grad():
        out, w = mha(x, positions=pos)
        rows = [mha(x[b : b + 1], positions=pos[b]) for b in range(2)]
        torch.testing.assert_close(out, torch.cat([r[0] for r in rows]), rtol=0, atol=1e-12)
        torch.testing.assert_close(w, torch.cat([r[1] for r in rows]), rtol=0, atol=1e-12)
        # independent reference: the dense R_m of each example's own positions on its split heads
        perm = (lambda t: t) if layout == "interleaved" else (lambda t: t[..., interleaved_to_half_index(8)])
        inv = (lambda t: t) if layout == "interleaved" else (lambda t: t[..., torch.argsort(interleaved_to_half_index(8))])
        from helpers.rope import apply_rope_matrix
        q = mha.split_heads(mha.linear_q(x))
        k = mha.repeat_kv(mha.linear_k(x).view(2, 5, mha.num_kv_heads, 8).transpose(1, 2))
        q = torch.stack([perm(apply_rope_matrix(inv(q[b]), pos[b])) for b in range(2)])
        k = torch.stack([perm(apply_rope_matrix(inv(k[b]), pos[b])) for b in range(2)])
        _, w_ref = scaled_dot_product_attention(q, k, k)
        torch.testing.assert_close(w, w_ref, rtol=0, atol=1e-12)
        assert (w - mha(x, positions=pos[0])[1]).abs().max() > 1e-3  # the positions matter
        # cross-attention with (batch, seq_k) key positions
        cross, cw = mha(x, mem, positions=pos, key_positions=kpos)
        rows = [mha(x[b : b + 1], mem[b : b + 1], positions=pos[b], key_positions=kpos[b]) for b in range(2)]
        torch.testing.assert_close(cross, torch.cat([r[0] for r in rows]), rtol=0, atol=1e-12)
        torch.testing.assert_close(cw, torch.cat([r[1] for r in rows]), rtol=0, atol=1e-12)


def test_rope_half_layout_equals_interleaved_with_permuted_weights():
    """The Llama conversion of notebook 07: half layout = interleaved layout after permuting W^Q, W^K rows per head."""
    torch.manual_seed(0)
    d, h = 16, 2
    inter = MultiHeadAttention(d, h, bias=False, rope=True, rope_layout="interleaved").eval()
    half = MultiHeadAttention(d, h, bias=False, rope=True, rope_layout="half").eval()
    half.load_state_dict(inter.state_dict())
    perm = interleaved_to_half_index(d // h)
    rows = torch.cat([i * (d // h) + perm for i in range(h)])
    with torch.no_grad():
        half.linear_q.weight.copy_(inter.linear_q.weight[rows])
        half.linear_k.weight.copy_(inter.linear_k.weight[rows])
    x = _randn(2, 5, d)
    with torch.no_grad():
        torch.testing.assert_close(half(x)[0], inter(x)[0], atol=1e-5, rtol=1e-4)
    assert "rope_layout='half'" in repr(half)


def test_dropout_paths():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4, dropout=0.5)
    x = _randn(2, 6, 16)
    mha.eval()
    with torch.no_grad():
        a, _ = mha(x)
        b, _ = mha(x, need_weights=False)
    torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    mha.train()
    torch.manual_seed(1)
    c, _ = mha(x, need_weights=False)  # dropout active: explicit path
    assert not torch.allclose(c, a)


def test_mha_errors():
    with pytest.raises(ValueError, match=r"d_model must be divisible by num_heads, got d_model=10, num_heads=4"):
        MultiHeadAttention(10, 4)
    with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\), got 1.5"):
        MultiHeadAttention(8, 2, dropout=1.5)
    with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\), got -0.1"):
        MultiHeadAttention(8, 2, dropout=-0.1)
    with pytest.raises(ValueError, match=r"num_heads must be >= 1, got 0"):
        MultiHeadAttention(8, 0)
    with pytest.raises(ValueError, match=r"rope=True needs an even head_dim .* got 6 / 2 = 3"):
        MultiHeadAttention(6, 2, rope=True)
    with pytest.raises(ValueError, match=r"rope_layout must be one of \('interleaved', 'half'\), got 'neox'"):
        MultiHeadAttention(8, 2, rope=True, rope_layout="neox")
    with pytest.raises(ValueError, match=r"rope_base must be a finite number > 0, got 0"):
        MultiHeadAttention(8, 2, rope=True, rope_base=0)
    mha = MultiHeadAttention(8, 2)
    x = _randn(2, 3, 8)
    with pytest.raises(ValueError, match=r"mask of shape \(4, 4\) is not broadcastable to the attention scores of "
                                         r"shape \(\.\.\., seq_q, seq_k\) = \(2, 2, 3, 3\)"):
        mha(x, mask=causal_mask(4))
    with pytest.raises(ValueError, match=r"head_mask must have shape \(num_heads,\) = \(2,\) or \(batch, num_heads\) = \(2, 2\), got \(3,\)"):
        mha(x, head_mask=torch.ones(3))
    with pytest.raises(ValueError, match=r"head_mask must have shape .* got \(3, 2\)"):
        mha(x, head_mask=torch.ones(3, 2))
    with pytest.raises(ValueError, match=r"query must have shape \(batch, seq, d_model=8\), got \(3, 8\)"):
        mha(x[0])
    with pytest.raises(ValueError, match=r"key and value must have the same \(batch, seq\)"):
        mha(x, x, x[:, :2])
    with pytest.raises(ValueError, match=r"positions/key_positions are only used with rope=True"):
        mha(x, positions=torch.arange(3))
    rope = MultiHeadAttention(8, 2, rope=True)
    with pytest.raises(ValueError, match=r"positions must have shape \(seq,\) or \(batch, seq\) with seq = 3, got \(4,\)"):
        rope(x, positions=torch.arange(4))


def test_finite_float_mask_fully_masked_row_by_dtype():
    """The documented behaviour of a finfo(dtype).min float mask on a fully masked row: it is added in the
    scores' dtype, so the row is uniform in float32/float64/bfloat16, but in float16 (spacing 32 near -65504)
    scaled scores <= -16 overflow to -inf and a row with every score <= -16 is NaN, gradient included;
    a bool mask gives 0 and a finite gradient."""
    q1, v4 = torch.ones(1, 1, 1, 1), torch.arange(1.0, 5.0).reshape(1, 1, 4, 1)   # d_k = 1, scale 1: scores = keys
    rows = {"small": [-1.0, 0.5, 1.0, 2.0], "one_low": [-20.0, -10.0, 0.0, 10.0], "one_high": [20.0, 0.0, -5.0, 3.0],
            "all_low": [-20.0, -30.0, -17.0, -40.0]}
    for dt in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        mask = torch.full((1, 4), torch.finfo(dt).min, dtype=dt)
        for name, scores in rows.items():
            k = torch.tensor(scores).reshape(1, 1, 4, 1).to(dt)
            out, w = scaled_dot_product_attention(q1.to(dt), k, v4.to(dt), mask=mask, scale=1.0)
            w = w.flatten().double()
            if dt != torch.float16 or name == "small":
                torch.testing.assert_close(w, torch.full((4,), 0.25, dtype=torch.float64), atol=1e-3, rtol=0)
            elif name == "one_low":
                torch.testing.assert_close(w, torch.tensor([0.0, 1 / 3, 1 / 3, 1 / 3], dtype=torch.float64), atol=1e-3, rtol=0)
            elif name == "one_high":
                torch.testing.assert_close(w, torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64), atol=1e-3, rtol=0)
            else:
                assert w.isnan().all() and out.isnan().all()
    k_low = torch.tensor(rows["all_low"]).reshape(1, 1, 4, 1).half()
    q_float = q1.half().requires_grad_(True)
    out = scaled_dot_product_attention(q_float, k_low, v4.half(), mask=torch.full((1, 4), torch.finfo(torch.float16).min,
                                       dtype=torch.float16), scale=1.0)[0]
    out.masked_fill(torch.ones_like(out, dtype=torch.bool), 0.0).sum().backward()
    assert q_float.grad.isnan().all()                      # zeroing the output afterwards does not clean the gradient
    q_bool = q1.half().requires_grad_(True)
    out = scaled_dot_product_attention(q_bool, k_low, v4.half(), mask=torch.zeros(1, 4, dtype=torch.bool), scale=1.0)[0]
    out.sum().backward()
    assert (out == 0).all() and torch.isfinite(q_bool.grad).all()
    # F.scaled_dot_product_attention computes float16 in float32 on the CPU: the same row is the unmasked output there
    ref = F.scaled_dot_product_attention(q1.half(), k_low, v4.half(), scale=1.0,
                                         attn_mask=torch.full((1, 4), torch.finfo(torch.float16).min, dtype=torch.float16))
    unmasked = torch.softmax(k_low.float().flatten(), dim=0) @ v4.flatten()
    torch.testing.assert_close(ref.flatten()[0].float(), unmasked, atol=5e-3, rtol=0)


def test_docstrings_say_nn_multiheadattention_returns_weights_after_dropout():
    """07 §3 measures it: torch's F.multi_head_attention_forward applies dropout to the weights it returns."""
    import inspect

    import helpers.attention as A

    doc = inspect.getdoc(A.scaled_dot_product_attention)
    assert "as ``nn.MultiheadAttention`` returns them" not in doc
    assert "*after* dropout" in doc


def test_scale_is_checked():
    q = torch.randn(1, 2, 3, 4)
    for bad, err in ((True, TypeError), ("0.5", TypeError), (0.0, ValueError), (float("inf"), ValueError)):
        with pytest.raises(err, match="scale"):
            scaled_dot_product_attention(q, q, q, scale=bad)


def test_a_bad_head_mask_is_refused_before_any_attention_is_computed(monkeypatch):
    """head_mask is checked with the other arguments (check_inputs), also in a KV-cache step."""
    from helpers.kvcache import KVCache

    mha = MultiHeadAttention(8, 2)
    monkeypatch.setattr(mha, "attend", lambda *a, **k: pytest.fail("attend ran before head_mask was checked"))
    for kw in ({}, {"cache": KVCache(1)}):
        with pytest.raises(ValueError, match=r"head_mask must have shape \(num_heads,\) = \(2,\)"):
            mha(torch.randn(1, 3, 8), head_mask=torch.ones(3), **kw)
