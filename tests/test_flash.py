"""helpers.flash (notebook 08): every entry point against torch's own attention, autograd and gradcheck.

References: ``F.scaled_dot_product_attention`` (no mask, causal, padding mask, GQA with
``enable_gqa`` and with ``repeat_interleave``), ``torch.softmax`` / ``torch.logsumexp``, autograd
through plain attention, ``torch.autograd.gradcheck`` in float64; the allocation counter against
exact byte counts and against torch's profiler. Shapes are small: the tiles run in a Python loop.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from helpers import flash as fl
from helpers.lab.memory import peak_memory
from helpers.viz.flash import tile_schedule_state

NEG_INF = float("-inf")


def _qkv(B=2, H=4, L=37, d=8, Hkv=None, Lk=None, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    Hkv, Lk = Hkv or H, Lk or L
    return (torch.randn(B, H, L, d, generator=g, dtype=dtype), torch.randn(B, Hkv, Lk, d, generator=g, dtype=dtype),
            torch.randn(B, Hkv, Lk, d, generator=g, dtype=dtype))


def _pad(B, L):
    pad = torch.ones(B, L, dtype=torch.bool)
    pad[0, L - 9:] = False
    if B > 1:
        pad[1, :L // 2 + 3] = False          # a whole first tile of padding
    return pad


def _sdpa(q, k, v, causal, pad):
    mask = None
    Lq, Lk = q.shape[2], k.shape[2]
    if causal or pad is not None:
        mask = torch.ones(q.shape[0], 1, Lq, Lk, dtype=torch.bool)
        if causal:
            mask = mask & torch.ones(Lq, Lk, dtype=torch.bool).tril()
        if pad is not None:
            mask = mask & pad[:, None, None, :]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1])


TOL = {torch.float32: 2e-6, torch.float64: 1e-12}


# ------------------------------------------------------------------------ online softmax
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("block", [1, 5, 64, 200])
def test_online_softmax_equals_softmax(dtype, block):
    x = torch.randn(3, 4, 130, dtype=dtype, generator=torch.Generator().manual_seed(1)) * 4
    torch.testing.assert_close(fl.online_softmax(x, block), torch.softmax(x, -1), atol=TOL[dtype], rtol=0)


def test_online_softmax_fully_masked_row_is_zero_and_masked_first_block_is_right():
    x = torch.randn(3, 12, dtype=torch.float64)
    x[:, :4] = NEG_INF
    x[2] = NEG_INF
    out = fl.online_softmax(x, 4)
    assert torch.equal(out[2], torch.zeros(12, dtype=torch.float64))
    torch.testing.assert_close(out[:2], torch.softmax(x[:2], -1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_online_softmax_update_fold_gives_attention_and_lse(dtype):
    g = torch.Generator().manual_seed(2)
    s = torch.randn(2, 3, 50, generator=g, dtype=dtype) * 3
    s[0, 0, :20] = NEG_INF                              # a fully masked first block for one row
    v = torch.randn(2, 3, 50, 4, generator=g, dtype=dtype)
    m = torch.full((2, 3), NEG_INF, dtype=dtype)
    l = torch.zeros(2, 3, dtype=dtype)
    acc = torch.zeros(2, 3, 4, dtype=dtype)
    for j in range(0, 50, 10):
        m, l, acc = fl.online_softmax_update(m, l, acc, s[..., j:j + 10], v[..., j:j + 10, :])
    assert not torch.isnan(acc).any()
    want = (torch.softmax(s, -1).unsqueeze(-1) * v).sum(-2)
    torch.testing.assert_close(acc / l.unsqueeze(-1), want, atol=TOL[dtype] * 10, rtol=0)
    torch.testing.assert_close(m + torch.log(l), torch.logsumexp(s, -1), atol=TOL[dtype] * 10, rtol=0)


def test_online_softmax_update_without_accumulator_and_all_masked_state():
    m, l = torch.full((2,), NEG_INF), torch.zeros(2)
    m2, l2, a2 = fl.online_softmax_update(m, l, None, torch.full((2, 3), NEG_INF))
    assert a2 is None and torch.isneginf(m2).all() and torch.equal(l2, torch.zeros(2))


@pytest.mark.parametrize("call, match", [
    (lambda: fl.online_softmax_update(torch.zeros(2), torch.zeros(3), None, torch.zeros(2, 4)), "m and l"),
    (lambda: fl.online_softmax_update(torch.zeros(2), torch.zeros(2), None, torch.zeros(3, 4)), "s must have shape"),
    (lambda: fl.online_softmax_update(torch.zeros(2), torch.zeros(2), torch.zeros(2, 5), torch.zeros(2, 4)), "v must be given"),
    (lambda: fl.online_softmax_update(torch.zeros(2), torch.zeros(2), torch.zeros(2, 5), torch.zeros(2, 4), torch.zeros(2, 4, 3)), "v must have shape"),
    (lambda: fl.online_softmax_update(torch.zeros(2), torch.zeros(2), torch.zeros(3, 5), torch.zeros(2, 4), torch.zeros(2, 4, 5)), "acc must have shape"),
    (lambda: fl.online_softmax(torch.zeros(3, 4), 0), "block_size must be >= 1"),
])
def test_online_softmax_bad_input_value_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("call, match", [
    (lambda: fl.online_softmax([1.0, 2.0], 2), "x must be a torch.Tensor"),
    (lambda: fl.online_softmax(torch.zeros(3, dtype=torch.long), 2), "x must be a floating-point tensor"),
    (lambda: fl.online_softmax(torch.zeros(3), 2.0), "block_size must be an int"),
    (lambda: fl.online_softmax_update(torch.zeros(2, dtype=torch.long), torch.zeros(2), None, torch.zeros(2, 1)), "m must be a floating"),
])
def test_online_softmax_bad_input_type_errors(call, match):
    with pytest.raises(TypeError, match=match):
        call()


# ------------------------------------------------------------------------------ forward
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("Hkv", [4, 2, 1])
def test_forward_equals_sdpa(dtype, causal, padded, Hkv):
    q, k, v = _qkv(Hkv=Hkv, dtype=dtype)
    pad = _pad(2, 37) if padded else None
    out, lse = fl.flash_attention_forward(q, k, v, causal=causal, key_padding_mask=pad, block_q=16, block_k=12)
    assert out.shape == q.shape and out.dtype == dtype and lse.shape == q.shape[:3]
    torch.testing.assert_close(out, _sdpa(q, k, v, causal, pad), atol=TOL[dtype] * 5, rtol=0)
    _, lse_ref = fl.materialized_attention(q, k, v, causal=causal, key_padding_mask=pad)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(lse_ref))
    alive = torch.isfinite(lse_ref)
    torch.testing.assert_close(lse[alive], lse_ref[alive], atol=TOL[dtype] * 5, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_input_accumulates_in_float32(dtype):
    # small scores at L = 2048: the normaliser grows to ~2048, where 8 (bfloat16) or 11 (float16) mantissa
    # bits lose each new term. Kept in the input dtype (this seed) the relative error was 1.7% (bfloat16) and
    # 0.23% (float16), against 0.44% and 0.06% for torch's kernel; accumulated in float32, 0.36% and 0.04%.
    q, k, v = _qkv(B=1, H=2, L=2048, d=16, seed=5)
    q = q * 0.05
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
    lo = [t.to(dtype) for t in (q, k, v)]
    out, lse = fl.flash_attention_forward(*lo, block_q=256, block_k=256)
    assert out.dtype == dtype and lse.dtype == torch.float32

    def rel(o):
        return ((o.double() - ref).abs().max() / ref.abs().max()).item()

    rel_torch = rel(F.scaled_dot_product_attention(*lo))
    assert rel(out) <= torch.finfo(dtype).eps and rel(out) <= 1.5 * rel_torch, (rel(out), rel_torch)
    lse_ref = torch.logsumexp(q.double() @ k.double().transpose(-2, -1) / 4, dim=-1)
    assert (lse.double() - lse_ref).abs().max() <= 0.01
    # the merge over chunks and the backward stay in float32 inside too
    dec, _ = fl.split_kv_decode(lo[0][:, :, -1:], lo[1], lo[2], 8)
    assert dec.dtype == dtype
    assert (dec.double() - ref[:, :, -1:]).abs().max() / ref.abs().max() <= 4 * torch.finfo(dtype).eps
    leaves = [t[:, :, :256].clone().requires_grad_() for t in lo]
    g = torch.randn(1, 2, 256, 16, generator=torch.Generator().manual_seed(1))
    fl.flash_attention(*leaves, block_q=64, block_k=64).backward(g.to(dtype))
    ref_leaves = [t[:, :, :256].double().requires_grad_() for t in lo]
    F.scaled_dot_product_attention(*ref_leaves).backward(g.double())
    for a, b in zip(leaves, ref_leaves):
        assert a.grad.dtype == dtype
        assert (a.grad.double() - b.grad).abs().max() / b.grad.abs().max() <= 8 * torch.finfo(dtype).eps


def test_forward_gqa_equals_repeat_interleave_and_cross_attention():
    q, k, v = _qkv(H=6, Hkv=3, L=20, Lk=33)
    ref = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1))
    torch.testing.assert_close(fl.flash_attention_forward(q, k, v, block_q=7, block_k=10)[0], ref, atol=2e-6, rtol=0)


def test_forward_lse_is_logsumexp_of_scaled_scores_and_custom_scale():
    q, k, v = _qkv(dtype=torch.float64)
    out, lse = fl.flash_attention_forward(q, k, v, scale=0.3, block_q=8, block_k=8)
    s = 0.3 * q @ k.transpose(-2, -1)
    torch.testing.assert_close(lse, torch.logsumexp(s, -1))
    torch.testing.assert_close(out, torch.softmax(s, -1) @ v)


def test_fully_masked_rows_give_zero_like_sdpa():
    q, k, v = _qkv()
    pad = _pad(2, 37)
    out, lse = fl.flash_attention_forward(q, k, v, causal=True, key_padding_mask=pad, block_q=8, block_k=8)
    dead = torch.isneginf(lse)
    n_dead = 37 // 2 + 3                                  # batch item 1: queries 0..21 see only padding
    assert int(dead[1].sum()) == 4 * n_dead and not dead[0].any()
    assert torch.equal(out[dead], torch.zeros_like(out[dead]))
    assert not torch.isnan(out).any()


@pytest.mark.parametrize("L, bq, bk", [(37, 16, 12), (64, 64, 64), (100, 32, 24), (5, 8, 8), (33, 1, 7)])
def test_causal_tile_counts_match_the_pass(L, bq, bk):
    q, k, v = _qkv(B=1, H=1, L=L)
    stats = fl.FlashStats()
    fl.flash_attention_forward(q, k, v, causal=True, block_q=bq, block_k=bk, stats=stats)
    assert (stats.tiles_computed, stats.tiles_total) == fl.causal_tile_counts(L, bq, bk)
    state = tile_schedule_state(L, bq, bk)
    assert (state["computed"], state["total"]) == fl.causal_tile_counts(L, bq, bk)
    stats_full = fl.FlashStats()
    fl.flash_attention_forward(q, k, v, block_q=bq, block_k=bk, stats=stats_full)
    assert stats_full.tiles_skipped == 0 and stats_full.tiles_total == stats.tiles_total


def test_causal_tile_counts_formula():
    for T in [1, 2, 7, 16]:
        assert fl.causal_tile_counts(64 * T, 64, 64) == (T * (T + 1) // 2, T * T)


def test_forward_inference_mode_and_meta():
    q, k, v = _qkv()
    with torch.inference_mode():
        out, _ = fl.flash_attention_forward(q, k, v, causal=True)
    torch.testing.assert_close(out, _sdpa(q, k, v, True, None), atol=2e-6, rtol=0)
    qm, km, vm = (t.to("meta") for t in (q, k, v))
    om, lm = fl.flash_attention_forward(qm, km, vm, block_q=16, block_k=16)
    assert om.shape == q.shape and om.device.type == "meta" and lm.shape == q.shape[:3]


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(q=torch.zeros(2, 4, 8)), ValueError, "q must have 4 dimensions"),
    (dict(q=torch.zeros(2, 4, 5, 8, dtype=torch.long)), TypeError, "q must be a floating-point"),
    (dict(k=torch.zeros(2, 4, 5, 8, dtype=torch.float64)), TypeError, "same dtype"),
    (dict(k=torch.zeros(2, 3, 5, 8), v=torch.zeros(2, 3, 5, 8)), ValueError, "multiple of the number of K/V heads"),
    (dict(q=torch.zeros(2, 0, 5, 8), k=torch.zeros(2, 0, 5, 8), v=torch.zeros(2, 0, 5, 8)), ValueError,
     r"q and k must each have at least 1 head \(dim 1\), got q \(2, 0, 5, 8\)"),
    (dict(q=torch.zeros(2, 0, 5, 8), k=torch.zeros(2, 2, 5, 8), v=torch.zeros(2, 2, 5, 8)), ValueError, "at least 1 head"),
    (dict(k=torch.zeros(2, 0, 5, 8), v=torch.zeros(2, 0, 5, 8)), ValueError, "at least 1 head"),
    (dict(k=torch.zeros(2, 4, 5, 6)), ValueError, "same head_dim"),
    (dict(v=torch.zeros(2, 4, 6, 8)), ValueError, "k and v must have the same heads and seq_k"),
    (dict(k=torch.zeros(3, 4, 5, 8), v=torch.zeros(3, 4, 5, 8)), ValueError, "same batch size"),
    (dict(causal=1), TypeError, "causal must be a bool"),
    (dict(k=torch.zeros(2, 4, 6, 8), v=torch.zeros(2, 4, 6, 8), causal=True), ValueError, "causal=True needs seq_q == seq_k"),
    (dict(key_padding_mask=torch.ones(2, 5)), TypeError, "key_padding_mask must be a bool tensor"),
    (dict(key_padding_mask=torch.ones(2, 6, dtype=torch.bool)), ValueError, r"key_padding_mask must have shape \(batch, seq_k\)"),
    (dict(scale=0.0), ValueError, "scale must be a positive finite number"),
    (dict(block_q=0), ValueError, "block_q must be >= 1"),
    (dict(block_k=2.5), TypeError, "block_k must be an int"),
    (dict(stats={}), TypeError, "stats must be a FlashStats"),
])
def test_forward_bad_input(kwargs, exc, match):
    args = dict(q=torch.zeros(2, 4, 5, 8), k=torch.zeros(2, 4, 5, 8), v=torch.zeros(2, 4, 5, 8))
    args.update(kwargs)
    q, k, v = args.pop("q"), args.pop("k"), args.pop("v")
    with pytest.raises(exc, match=match):
        fl.flash_attention_forward(q, k, v, **args)


def test_materialized_attention_equals_sdpa():
    q, k, v = _qkv(Hkv=2)
    pad = _pad(2, 37)
    out, _ = fl.materialized_attention(q, k, v, causal=True, key_padding_mask=pad)
    torch.testing.assert_close(out, _sdpa(q, k, v, True, pad), atol=2e-6, rtol=0)
    with pytest.raises(ValueError, match="causal=True needs"):
        fl.materialized_attention(q, k[:, :, :5], v[:, :, :5], causal=True)


# ----------------------------------------------------------------------------- backward
@pytest.mark.parametrize("causal, padded, Hkv", [(False, False, 4), (True, False, 2), (True, True, 1), (False, True, 4)])
def test_backward_equals_autograd(causal, padded, Hkv):
    q, k, v = _qkv(Hkv=Hkv)
    pad = _pad(2, 37) if padded else None
    g = torch.randn(q.shape, generator=torch.Generator().manual_seed(5))
    grads = []
    for tiled in (True, False):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        if tiled:
            out = fl.flash_attention(*leaves, causal=causal, key_padding_mask=pad, block_q=16, block_k=12)
        else:
            out = _sdpa(*leaves, causal, pad)
        out.backward(g)
        grads.append([t.grad for t in leaves])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kw", [dict(), dict(causal=True), dict(causal=True, key_padding_mask=torch.tensor([[True] * 4 + [False] * 2]))])
def test_gradcheck_float64(kw):
    g = torch.Generator().manual_seed(3)
    leaves = [torch.randn(1, h, 6, 3, generator=g, dtype=torch.float64, requires_grad=True) for h in (2, 1, 1)]
    assert torch.autograd.gradcheck(lambda a, b, c: fl.flash_attention(a, b, c, block_q=4, block_k=3, **kw), leaves)


def test_backward_saves_only_qkv_output_and_lse():
    q, k, v = (t.requires_grad_() for t in _qkv(B=1, H=1, L=256, d=16))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
        fl.flash_attention(q, k, v, block_q=64, block_k=64)
    assert sorted(saved) == sorted([(1, 1, 256, 16)] * 4 + [(1, 1, 256)])


def test_flash_attention_bad_input():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="block_q must be >= 1"):
        fl.flash_attention(q, k, v, block_q=0)
    with pytest.raises(TypeError, match="causal must be a bool"):
        fl.flash_attention(q, k, v, causal="yes")


# ------------------------------------------------------------------------- merge, split-K
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_merge_partials_equals_attention_over_union(dtype):
    q, k, v = _qkv(B=1, H=2, L=3, Lk=40, dtype=dtype)
    parts = [(0, 13), (13, 14), (14, 40)]
    outs, lses = zip(*[fl.materialized_attention(q, k[:, :, a:b], v[:, :, a:b]) for a, b in parts])
    out, lse = fl.merge_attention_partials(outs, lses)
    ref, lse_ref = fl.materialized_attention(q, k, v)
    torch.testing.assert_close(out, ref, atol=TOL[dtype] * 5, rtol=0)
    torch.testing.assert_close(lse, lse_ref, atol=TOL[dtype] * 5, rtol=0)


def test_merge_partials_empty_parts_and_large_lse():
    o1, o2 = torch.randn(2, 4), torch.randn(2, 4)
    out, lse = fl.merge_attention_partials([o1, torch.zeros(2, 4)], [torch.tensor([300.0, 1.0]), torch.full((2,), NEG_INF)])
    torch.testing.assert_close(out, o1)
    torch.testing.assert_close(lse, torch.tensor([300.0, 1.0]))
    out, lse = fl.merge_attention_partials([o1, o2], [torch.full((2,), NEG_INF)] * 2)
    assert torch.equal(out, torch.zeros(2, 4)) and torch.isneginf(lse).all()
    out, _ = fl.merge_attention_partials([o1, o2], [torch.full((2,), 500.0)] * 2)
    torch.testing.assert_close(out, (o1 + o2) / 2)


@pytest.mark.parametrize("call, exc, match", [
    (lambda: fl.merge_attention_partials([], []), ValueError, "at least one part"),
    (lambda: fl.merge_attention_partials([torch.zeros(2, 3)], []), ValueError, "same length"),
    (lambda: fl.merge_attention_partials([torch.zeros(2, 3), torch.zeros(2, 4)], [torch.zeros(2)] * 2), ValueError, r"outs\[1\] has shape"),
    (lambda: fl.merge_attention_partials([torch.zeros(2, 3)], [torch.zeros(3)]), ValueError, r"lses\[0\] must have shape"),
    (lambda: fl.merge_attention_partials(torch.zeros(2, 2, 3), torch.zeros(2, 2)), TypeError, "sequences"),
])
def test_merge_bad_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


@pytest.mark.parametrize("splits", [1, 3, 8, 50])
def test_split_kv_decode_equals_full_attention(splits):
    q, k, v = _qkv(B=2, H=4, Hkv=2, L=1, Lk=50)
    out, lse, outs, lses = fl.split_kv_decode(q, k, v, splits, return_partials=True)
    torch.testing.assert_close(out, _sdpa(q, k, v, False, None), atol=2e-6, rtol=0)
    assert len(outs) == len(lses) == splits
    torch.testing.assert_close(lse, fl.materialized_attention(q, k, v)[1], atol=2e-6, rtol=0)


def test_split_kv_decode_with_an_empty_chunk_and_bad_input():
    q, k, v = _qkv(B=1, H=2, L=1, Lk=40)
    pad = torch.ones(1, 40, dtype=torch.bool)
    pad[0, 10:20] = False
    out, _, _, lses = fl.split_kv_decode(q, k, v, 4, key_padding_mask=pad, return_partials=True)
    assert torch.isneginf(lses[1]).all()
    torch.testing.assert_close(out, _sdpa(q, k, v, False, pad), atol=2e-6, rtol=0)
    with pytest.raises(ValueError, match="num_splits must be <= the cache length 40"):
        fl.split_kv_decode(q, k, v, 41)
    with pytest.raises(ValueError, match="num_splits must be >= 1"):
        fl.split_kv_decode(q, k, v, 0)


def test_split_kv_decode_refuses_several_new_queries():
    """A chunked step (3 new tokens already appended to the cache) would be silently non-causal: refused."""
    q, k, v = _qkv(B=1, H=2, L=3, Lk=40)
    with pytest.raises(ValueError, match=r"q must hold one new query per head, shape \(batch, heads, 1, d\), got \(1, 2, 3, 8\)"):
        fl.split_kv_decode(q, k, v, 4)
    out, _ = fl.split_kv_decode(q[:, :, -1:], k, v, 4)            # the last new query alone: every key is in its past
    torch.testing.assert_close(out, _sdpa(q[:, :, -1:], k, v, False, None), atol=2e-6, rtol=0)


# --------------------------------------------------------------------------- byte counts
def test_byte_counts_and_errors():
    assert fl.score_matrix_bytes(2, 3, 5, 7) == 2 * 3 * 5 * 7 * 4
    assert fl.score_matrix_bytes(1, 1, 10, 10, torch.bfloat16) == 200
    assert fl.tiled_working_bytes(1, 1, 4, 8, 16) == (2 * 32 + 2 * 64 + 8) * 4
    with pytest.raises(ValueError, match="seq_q must be >= 1"):
        fl.score_matrix_bytes(1, 1, 0, 3)
    with pytest.raises(TypeError, match="dtype must be a torch.dtype"):
        fl.score_matrix_bytes(1, 1, 2, 3, "float32")
    with pytest.raises(TypeError, match="block_k must be an int"):
        fl.tiled_working_bytes(1, 1, 4, None, 16)
    with pytest.raises(ValueError, match="seq_len must be >= 1"):
        fl.causal_tile_counts(0, 4, 4)


# --------------------------------------------------------------------------- peak memory
def test_peak_memory_of_plain_attention_is_exact():
    L, d = 256, 16
    q, k, v = _qkv(B=1, H=1, L=L, d=d)

    def plain(q, k, v):
        s = (q / math.sqrt(d)) @ k.transpose(-2, -1)
        p = torch.softmax(s, -1)
        return p @ v

    rep = peak_memory(plain, q, k, v)
    assert rep.peak_bytes == 2 * 4 * L * L + 4 * L * d           # S, P and the output being built (q/sqrt(d) is freed)
    assert rep.retained_bytes == 4 * L * d                       # only the result is still alive
    assert rep.n_allocations == 4 and "_softmax" in rep.ops


def test_peak_memory_ignores_views_and_inplace_and_frees():
    x = torch.zeros(100)

    def f(x):
        _view = x[10:]               # a view of an outside tensor: not counted
        x.add_(1)                    # in place: not counted
        z = torch.ones(50)           # 200 bytes
        del z
        w = torch.ones(25)           # 100 bytes, after z is freed
        return w

    rep = peak_memory(f, x)
    assert rep.peak_bytes == 200 and rep.allocated_bytes == 300 and rep.retained_bytes == 100


def test_tiled_needs_much_less_memory_than_plain():
    q, k, v = _qkv(B=1, H=1, L=1024, d=32)
    plain = peak_memory(fl.materialized_attention, q, k, v)
    tiled = peak_memory(fl.flash_attention_forward, q, k, v, block_q=128, block_k=128)
    assert plain.peak_bytes >= 2 * fl.score_matrix_bytes(1, 1, 1024, 1024)
    assert plain.peak_bytes >= 8 * tiled.peak_bytes
    torch.testing.assert_close(plain.result[0], tiled.result[0], atol=2e-6, rtol=0)


def test_peak_memory_agrees_with_the_profiler_on_plain_attention():
    profiler = pytest.importorskip("torch.profiler")
    L = 512
    q, k, v = _qkv(B=1, H=1, L=L, d=32)
    counted = peak_memory(fl.materialized_attention, q, k, v).peak_bytes
    with profiler.profile(activities=[profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        fl.materialized_attention(q, k, v)
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    running, peak = 0, 0
    for _, nbytes in events:
        running += nbytes
        peak = max(peak, running)
    assert 0.9 * counted <= peak <= 1.5 * counted


def test_peak_memory_bad_input():
    with pytest.raises(TypeError, match="fn must be callable"):
        peak_memory(3)


def test_tile_schedule_state_bad_input():
    with pytest.raises(ValueError, match="block_q must be an int >= 1"):
        tile_schedule_state(64, 0, 8)
    with pytest.raises(TypeError, match="causal must be a bool"):
        tile_schedule_state(64, 8, 8, causal=None)
    s = tile_schedule_state(64, 8, 8, causal=False)
    assert s["skipped"] == 0 and s["computed"] == 64


# ------------------------------------------------- notebook 08 §3's exact peak bytes (the 101x and 68x of its prose)
@pytest.mark.skipif(not torch.__version__.startswith("2.13."), reason="exact allocation counts pinned for torch 2.13")
def test_notebook_08_memory_goal_bytes_are_exact():
    """README, CONTRIBUTING and notebook 08 (promise, §3, Takeaways) state 101x and 68x: the counter is exact."""
    def plain_attention(q, k, v):      # notebook 08 §1's version, line for line
        s = (q / math.sqrt(q.shape[-1])) @ k.transpose(-2, -1)
        return torch.softmax(s, dim=-1) @ v

    L, d, blk = 4096, 64, 256
    q, k, v = _qkv(B=1, H=1, L=L, d=d)
    masked = peak_memory(fl.materialized_attention, q, k, v).peak_bytes
    two = peak_memory(plain_attention, q, k, v).peak_bytes
    tiled = peak_memory(fl.flash_attention_forward, q, k, v, block_q=blk, block_k=blk).peak_bytes
    scores = fl.score_matrix_bytes(1, 1, L, L)
    assert masked == 3 * scores + 4 * L + L == 201_347_072           # S, S - lse, P; the lse; the bool mask
    assert two == 2 * scores + 4 * L * d == 135_266_304              # S, P; the output
    out_lse, working = 4 * L * d + 4 * L, fl.tiled_working_bytes(1, 1, blk, blk, d)
    assert tiled == out_lse + working + 4 * blk * blk + 3 * 4 * blk + blk == 1_987_840
    assert (round(masked / tiled), round(two / tiled)) == (101, 68)


def test_flash_refuses_double_backward_instead_of_a_wrong_hessian():
    """lse is saved as an intermediate, so a graph through the backward would miss it: refused, not wrong."""
    from helpers.flash import flash_attention

    x = torch.randn(1, 1, 4, 8, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(flash_attention(x, x, x).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError):
        torch.autograd.grad(g.sum(), x)


def test_flash_bad_inputs_name_the_rule():
    import numpy as np

    from helpers.flash import flash_attention, online_softmax_update

    q = torch.randn(1, 1, 4, 0)
    with pytest.raises(ValueError, match="head_dim .* must be at least 1"):
        flash_attention(q, q, q)
    q = torch.randn(1, 1, 4, 8)
    torch.testing.assert_close(flash_attention(q, q, q, scale=np.float32(0.5)), flash_attention(q, q, q, scale=0.5))
    m, l = torch.full((2,), float("-inf")), torch.zeros(2)
    with pytest.raises(TypeError, match="must share one dtype"):
        online_softmax_update(m, l, None, torch.randn(2, 3, dtype=torch.float64))
