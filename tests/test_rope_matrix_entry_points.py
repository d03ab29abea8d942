"""One test matrix that every public RoPE entry point must pass.

Entry points: ``apply_rope`` (both layouts; ``frequencies=``; ``scale=``; ``ntk_scale=``),
``apply_rope_complex``, ``RotaryEmbedding`` (both layouts), ``MultiHeadAttention(rope=True)``
(self-attention, cross-attention, grouped-query attention, decoding with a
``helpers.kvcache.KVCache``) and ``TinyTransformer(pos="rope")``;
x positions: ``None``, ``(seq,)``, ``(batch, seq)`` with batch == heads and batch != heads,
offsets, a list of Python ints;
x dtypes: float32, float64, bfloat16, float16;
x modes: gradients off, gradients on, first call under ``torch.inference_mode()`` then a
call with gradients. The opt-in fused kernel (``helpers.lab.rope_kernel.fused_apply_rope``, both
layouts) has rows of its own for bfloat16/float16, where it can be built.

The reference is independent of the code under test: every (example, position) row is
multiplied by the dense block-diagonal :math:`R_m` in float64 (built here from the per-pair
frequencies and checked once against ``helpers.rope.rotation_matrix``), and attention /
the tiny transformer are recomputed in float64 from the modules' weights with plain torch
ops. Backward passes are compared with autograd through that float64 reference.
"""
from __future__ import annotations

import functools
import math

import pytest
import torch
import torch.nn.functional as F

from helpers import rope as R
from helpers.attention import MultiHeadAttention
from helpers.kvcache import KVCache
from helpers.lab import rope_kernel
from helpers.model import TinyTransformer

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
# (atol, rtol) for values of order 1: a few ulps of the dtype over a handful of ops; float32 angles of
# positions ~1000 carry ~1000 * 2^-24 rad of rounding (angles are float32 for every dtype but float64).
TOL = {torch.float64: (1e-10, 1e-10), torch.float32: (2e-4, 1e-4), torch.bfloat16: (4e-2, 4e-2),
       torch.float16: (5e-3, 5e-3)}
# whole attention layers / models: more ops, more rounding
TOL_NET = {torch.float64: (1e-9, 1e-9), torch.float32: (1e-4, 1e-4), torch.bfloat16: (1.5e-1, 1e-1),
           torch.float16: (2e-2, 2e-2)}
MODES = ["no_grad", "grad", "inference_first"]
DTYPE_IDS = [str(dt).replace("torch.", "") for dt in DTYPES]
POSITIONS = ["none", "seq", "batch_eq_heads", "batch_ne_heads", "offset", "int_list"]
D, S, BASE = 8, 5, 10000.0


# ----------------------------------------------------------------------------- reference
def dense_R(p: float, theta: torch.Tensor) -> torch.Tensor:
    """Block-diagonal rotation by angles p * theta_i on dimension pairs (2i, 2i+1), float64."""
    return _dense_R(float(p), tuple(theta.tolist())).clone()


@functools.lru_cache(maxsize=None)
def _dense_R(p: float, theta: tuple) -> torch.Tensor:
    d = 2 * len(theta)
    M = torch.zeros(d, d, dtype=torch.float64)
    for i, t in enumerate(theta):
        c, s = math.cos(p * t), math.sin(p * t)
        M[2 * i, 2 * i], M[2 * i, 2 * i + 1], M[2 * i + 1, 2 * i], M[2 * i + 1, 2 * i + 1] = c, -s, s, c
    return M


def test_dense_reference_is_rotation_matrix():
    theta = R.rope_frequencies(D, BASE, dtype=torch.float64)
    for p in (0, 3, 100, 4097):
        torch.testing.assert_close(dense_R(p, theta), R.rotation_matrix(p, D, BASE, dtype=torch.float64),
                                   atol=1e-12, rtol=0)


def rotate_ref(x64: torch.Tensor, pos: torch.Tensor, theta: torch.Tensor, layout: str) -> torch.Tensor:
    """x64 ``(B, H, S, d)``; pos ``(B, S)`` float64: row (b, h, s) is multiplied by R_{pos[b, s]}."""
    B, _, n, d = x64.shape
    perm = R.interleaved_to_half_index(d)  # half layout: permute to interleaved, rotate, permute back
    inv = torch.argsort(perm)
    xi = x64[..., inv] if layout == "half" else x64
    th = tuple(theta.tolist())
    pl = pos.tolist()
    Rs = torch.stack([torch.stack([_dense_R(float(pl[b][s]), th) for s in range(n)]) for b in range(B)])
    out = torch.einsum("bsij,bhsj->bhsi", Rs, xi)
    return out[..., perm] if layout == "half" else out


def make_positions(case: str, B: int, n: int, start: int = 0):
    """(argument to pass, the (B, n) float64 positions it means)."""
    base = torch.arange(start, start + n)
    if case == "none":
        return None, base.double().expand(B, n)
    if case == "seq":
        p = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6, 5, 3][:n]) * 7 + start
        return p, p.double().expand(B, n)
    if case in ("batch_eq_heads", "batch_ne_heads"):
        p = torch.stack([base * (b + 1) + 50 * b for b in range(B)])
        return p, p.double()
    if case == "offset":
        p = base + 1000
        return p, p.double().expand(B, n)
    if case == "int_list":
        p = [int(v) for v in (base * 3 + 2)]
        return p, torch.tensor(p, dtype=torch.float64).expand(B, n)
    raise AssertionError(case)


def shape_for(case: str, heads: int = 2) -> int:
    """Batch size: == heads for batch_eq_heads (the case where right-aligned broadcasting is silent)."""
    return heads if case == "batch_eq_heads" else heads + 1


# ------------------------------------------------------------------- rotation entry points
def _theta(base=BASE, d=D):
    return R.rope_frequencies(d, base, dtype=torch.float64)


LLAMA3 = R.llama3_frequencies(D, base=BASE, factor=4.0, original_max_position_embeddings=16)

# name -> (call(x, positions, fresh_state), layout, theta (float64), position divisor)
ENTRY_POINTS = {
    "apply_rope": (lambda x, p, st: R.apply_rope(x, p, BASE), "interleaved", _theta(), 1.0),
    "apply_rope_half": (lambda x, p, st: R.apply_rope(x, p, BASE, layout="half"), "half", _theta(), 1.0),
    "apply_rope_frequencies": (lambda x, p, st: R.apply_rope(x, p, frequencies=LLAMA3), "interleaved",
                               LLAMA3.double(), 1.0),
    "apply_rope_frequencies_half_scale": (lambda x, p, st: R.apply_rope(x, p, layout="half", scale=2.0,
                                                                        frequencies=LLAMA3),
                                          "half", LLAMA3.double(), 2.0),
    "apply_rope_scale": (lambda x, p, st: R.apply_rope(x, p, BASE, scale=4.0), "interleaved", _theta(), 4.0),
    "apply_rope_ntk": (lambda x, p, st: R.apply_rope(x, p, BASE, layout="half", ntk_scale=4.0), "half",
                       _theta(R.ntk_scaled_base(BASE, 4.0, D)), 1.0),
    "apply_rope_complex": (lambda x, p, st: R.apply_rope_complex(x, p, BASE), "interleaved", _theta(), 1.0),
    "RotaryEmbedding": (lambda x, p, st: st["rot_i"](x, p), "interleaved", _theta(), 1.0),
    "RotaryEmbedding_half_scale": (lambda x, p, st: st["rot_h"](x, p), "half", _theta(), 2.0),
}
# the opt-in fused kernel: float16/bfloat16 CPU tensors only, where it can be built
FUSED = {
    "fused_apply_rope": (lambda x, p, st: rope_kernel.fused_apply_rope(x, p, BASE), "interleaved", _theta(), 1.0),
    "fused_apply_rope_half": (lambda x, p, st: rope_kernel.fused_apply_rope(x, p, BASE, layout="half"), "half",
                              _theta(), 1.0),
}


def fresh_state():
    R._cached_tables.cache_clear()  # so that "inference_first" really builds the tables under inference_mode
    return {"rot_i": R.RotaryEmbedding(D, BASE, initial_cache_len=4),
            "rot_h": R.RotaryEmbedding(D, BASE, layout="half", scale=2.0, initial_cache_len=4)}


def run_mode(mode: str, dtype, make_input, forward, reference, tol):
    """Run ``forward`` under ``mode`` and compare the output (and the input gradient) with ``reference``.

    make_input() -> (x in ``dtype``, x64 float64 copy); forward(x) -> output; reference(x64) -> float64.
    """
    atol, rtol = tol
    x, x64 = make_input()
    if mode == "inference_first":
        with torch.inference_mode():
            out = forward(x)
        torch.testing.assert_close(out.double(), reference(x64), atol=atol, rtol=rtol)
    if mode == "no_grad":
        with torch.no_grad():
            out = forward(x)
        assert out.dtype == dtype
        torch.testing.assert_close(out.double(), reference(x64), atol=atol, rtol=rtol)
        return
    # gradients on (after the inference-mode call, for "inference_first")
    x = x.detach().requires_grad_(True)
    x64 = x64.detach().requires_grad_(True)
    out = forward(x)
    assert out.dtype == dtype and out.requires_grad
    ref = reference(x64)
    torch.testing.assert_close(out.double().detach(), ref.detach(), atol=atol, rtol=rtol)
    w = torch.randn(ref.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    (out.double() * w).sum().backward()
    (ref * w).sum().backward()
    assert x.grad is not None and x.grad.dtype == dtype
    torch.testing.assert_close(x.grad.double(), x64.grad, atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("case", POSITIONS)
@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_rotation_entry_point(entry, case, dtype):
    for mode in MODES:  # the three modes in one test: fewer, cheaper tests
        _rotation_entry_point(ENTRY_POINTS[entry], case, dtype, mode)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
@pytest.mark.parametrize("case", POSITIONS)
@pytest.mark.parametrize("entry", list(FUSED))
def test_fused_kernel_entry_point(entry, case, dtype):
    if "available for" not in rope_kernel.status(dtype):
        pytest.skip(f"fused RoPE kernel unavailable here: {rope_kernel.status(dtype)}")
    for mode in MODES:
        _rotation_entry_point(FUSED[entry], case, dtype, mode)


def _rotation_entry_point(entry, case, dtype, mode):
    call, layout, theta, div = entry
    H = 2
    B = shape_for(case, H)
    arg, pos = make_positions(case, B, S)
    st = fresh_state()
    g = torch.Generator().manual_seed(0)
    x0 = torch.randn(B, H, S, D, generator=g, dtype=torch.float64)

    def make_input():
        x = x0.to(dtype)
        return x, x.double()  # the reference rotates exactly the rounded input

    run_mode(mode, dtype, make_input, lambda x: call(x, arg, st), lambda x64: rotate_ref(x64, pos / div, theta, layout),
             TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_matrix_detects_per_head_positions(dtype):
    """The comparison can fail: the old bug (row b of (batch, seq) positions applied to head b) and
    unrotated keys are both far outside every tolerance."""
    B = H = 2
    arg, pos = make_positions("batch_eq_heads", B, S)
    x = torch.randn(B, H, S, D, dtype=torch.float64).to(dtype)
    ref = rotate_ref(x.double(), pos, _theta(), "interleaved")
    wrong = torch.stack([R.apply_rope(x[:, h].double(), arg[h], BASE) for h in range(H)], dim=1)  # per head
    atol, rtol = TOL[dtype]
    assert ((wrong - ref).abs() - (atol + rtol * ref.abs())).max() > 0.5
    assert ((x.double() - ref).abs() - (atol + rtol * ref.abs())).max() > 0.5


def test_int_positions_are_refused_everywhere():
    x = torch.randn(1, 2, S, D)
    for call, *_ in ENTRY_POINTS.values():
        with pytest.raises(ValueError, match=r"positions must have one entry per sequence position \(last dimension = seq = 5\), got shape \(\)"):
            call(x, 3, fresh_state())


# ------------------------------------------------------------------- attention reference
def mha_ref(m: MultiHeadAttention, xq64, xk64, pq, pk, causal: bool):
    """Float64 multi-head attention from ``m``'s weights; pq ``(B, n_q)``, pk ``(B, n_k)`` positions."""
    W = {n: (getattr(m, n).weight.double(), None if getattr(m, n).bias is None else getattr(m, n).bias.double())
         for n in ("linear_q", "linear_k", "linear_v", "linear_out")}
    B, nq, _ = xq64.shape
    nk = xk64.shape[1]
    h, g, dk = m.num_heads, m.num_kv_heads, m.head_dim
    q = F.linear(xq64, *W["linear_q"]).view(B, nq, h, dk).transpose(1, 2)
    k = F.linear(xk64, *W["linear_k"]).view(B, nk, g, dk).transpose(1, 2)
    v = F.linear(xk64, *W["linear_v"]).view(B, nk, g, dk).transpose(1, 2)
    theta = m.rope_inv_freq.double() if m.rope_inv_freq is not None else _theta(m.rope_base, dk)
    q = rotate_ref(q, pq, theta, m.rope_layout)
    k = rotate_ref(k, pk, theta, m.rope_layout)
    k = k.repeat_interleave(h // g, dim=1)  # consecutive query heads share a K/V head
    v = v.repeat_interleave(h // g, dim=1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(dk)
    if causal:
        scores = scores.masked_fill(~torch.ones(nq, nk, dtype=torch.bool).tril(nk - nq), float("-inf"))
    out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, nq, h * dk)
    return F.linear(out, *W["linear_out"])


MHA_KINDS = ["self", "cross", "gqa", "kvcache"]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("case", POSITIONS)
@pytest.mark.parametrize("kind", MHA_KINDS)
def test_multi_head_attention(kind, case, dtype):
    for mode in MODES:
        _multi_head_attention(kind, case, dtype, mode)


def _multi_head_attention(kind, case, dtype, mode):
    H = 2
    B = shape_for(case, H)
    torch.manual_seed(0)
    m = MultiHeadAttention(H * D, H, rope=True, num_kv_heads=1 if kind == "gqa" else None,
                           rope_layout="half" if kind == "gqa" else "interleaved").to(dtype)
    R._cached_tables.cache_clear()
    nq = S
    nk = S + 2 if kind == "cross" else S
    arg, pq = make_positions(case, B, nq)
    karg, pk = make_positions(case, B, nk, start=0 if case == "none" else 10)
    x0 = torch.randn(B, nq, H * D, dtype=torch.float64)
    k0 = torch.randn(B, nk, H * D, dtype=torch.float64)
    kd = k0.to(dtype)

    def make_input():
        x = x0.to(dtype)
        return x, x.double()

    if kind == "cross":
        def forward(x):
            return m(x, kd, kd, positions=arg, key_positions=karg, need_weights=False)[0]

        def reference(x64):
            return mha_ref(m, x64, kd.double(), pq, pk, causal=False)
    elif kind == "kvcache":
        cut = 3  # prefill 3 tokens, then decode one token at a time

        def sl(a, i, j):
            if a is None:
                return None
            a = torch.as_tensor(a)
            return a[..., i:j]

        def forward(x):
            cache = KVCache(1)
            outs = [m(x[:, :cut], cache=cache, positions=sl(arg, 0, cut), need_weights=False)[0]]
            for t in range(cut, nq):
                outs.append(m(x[:, t:t + 1], cache=cache, positions=sl(arg, t, t + 1), need_weights=True)[0])
            assert cache.seq_len() == nq
            return torch.cat(outs, dim=1)

        def reference(x64):
            return mha_ref(m, x64, x64, pq, pq, causal=True)
    else:
        causal = torch.ones(nq, nq, dtype=torch.bool).tril()

        def forward(x):
            return m(x, mask=causal, positions=arg, need_weights=(kind == "self"))[0]

        def reference(x64):
            return mha_ref(m, x64, x64, pq, pq, causal=True)

    run_mode(mode, dtype, make_input, forward, reference, TOL_NET[dtype])


# ------------------------------------------------------------------- the tiny transformer
def tiny_ref(model: TinyTransformer, tokens, pos):
    """Float64 forward of a pre-LN ``TinyTransformer(pos="rope")`` from its weights."""
    def lin(mod, t):
        return F.linear(t, mod.weight.double(), None if mod.bias is None else mod.bias.double())

    def ln(mod, t):
        return F.layer_norm(t, mod.normalized_shape, mod.weight.double(), mod.bias.double(), mod.eps)

    x = model.tok_emb.weight.double()[tokens]
    for blk in model.blocks:
        x = x + mha_ref(blk.attn, ln(blk.ln1, x), ln(blk.ln1, x), pos, pos, causal=True)
        h = ln(blk.ln2, x)
        x = x + lin(blk.ff[2], torch.relu(lin(blk.ff[0], h)))
    return lin(model.head, ln(model.ln_f, x))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("case", [c for c in POSITIONS if c != "offset"] + ["offset_kw"])
def test_tiny_transformer(case, dtype):
    for mode in MODES:
        _tiny_transformer(case, dtype, mode)


def _tiny_transformer(case, dtype, mode):
    H = 2
    B = shape_for(case, H)
    model = TinyTransformer(11, H * D, H, 1, 32, pos="rope", d_ff=16, seed=0).to(dtype)
    R._cached_tables.cache_clear()
    tokens = torch.randint(0, 11, (B, S), generator=torch.Generator().manual_seed(1))
    if case == "offset_kw":
        arg, pos, kw = None, torch.arange(7, 7 + S).double().expand(B, S), {"offset": 7}
    else:
        arg, pos = make_positions(case, B, S)
        kw = {}
    if mode == "no_grad":
        ctx = torch.no_grad()
    elif mode == "inference_first":
        with torch.inference_mode():
            first = model(tokens, positions=arg, **kw)
        torch.testing.assert_close(first.double(), tiny_ref(model, tokens, pos), atol=TOL_NET[dtype][0] * 2,
                                   rtol=TOL_NET[dtype][1] * 2)
        ctx = torch.enable_grad()
    else:
        ctx = torch.enable_grad()
    with ctx:
        out = model(tokens, positions=arg, **kw)
    assert out.dtype == dtype
    ref = tiny_ref(model, tokens, pos)  # differentiable in the model's weights (through .double())
    atol, rtol = TOL_NET[dtype]
    torch.testing.assert_close(out.double().detach(), ref.detach(), atol=atol * 2, rtol=rtol * 2)
    if mode != "no_grad":  # a training step: the query projection's gradient against autograd in float64
        wq = model.blocks[0].attn.linear_q.weight
        w = torch.randn(ref.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
        (ref * w).sum().backward()
        g_ref = wq.grad.double().clone()
        model.zero_grad()
        (out.double() * w).sum().backward()
        assert wq.grad is not None and wq.grad.dtype == dtype
        scale = float(g_ref.abs().max())
        torch.testing.assert_close(wq.grad.double(), g_ref, atol=4 * atol * scale, rtol=4 * rtol)
