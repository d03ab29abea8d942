"""The fused float16/bfloat16 RoPE kernel (``helpers.rope_kernel``) against independent references.

The reference for the forward pass is NumPy float32 arithmetic (each product and sum rounded
to float32, no fused multiply-add), rounded once to the output dtype by ``Tensor.to``: the
kernel must equal it bit for bit, on the vectorised part of a row and on its scalar tail
(head dims 6, 16, 20, 128). The operator fallback (``rope_kernel.disabled()``) must be at
most one unit in the last place away (PyTorch's vectorised ``addcmul_`` may fuse its
multiply-add, i.e. round once where the kernel rounds twice; on this AVX2 CPU the
interleaved fallback, Meta's upcast-rotate-round, gives the same bits). The whole-entry-point matrix with the kernel on and
off is ``tests/test_rope_matrix_entry_points.py``.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import rope as R
from helpers import rope_kernel as K
from helpers.rope import apply_rope

LOWP = [torch.bfloat16, torch.float16]
ROOT = Path(__file__).resolve().parents[1]

needs_kernel = pytest.mark.skipif("used for" not in K.status(torch.bfloat16),
                                  reason=f"fused RoPE kernel unavailable here: {K.status(torch.bfloat16)}")


def numpy_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> torch.Tensor:
    """float32 products and sums in NumPy (no FMA), rounded once to ``x.dtype``."""
    xf = x.float().numpy()
    d = x.shape[-1]
    shape = x.shape[:-1] + (d // 2,)
    c = np.broadcast_to(cos.numpy(), shape).astype(np.float32)
    s = np.broadcast_to(sin.numpy(), shape).astype(np.float32)
    a, b = (xf[..., : d // 2], xf[..., d // 2:]) if layout == "half" else (xf[..., 0::2], xf[..., 1::2])
    ya = (a * c).astype(np.float32) - (b * s).astype(np.float32)
    yb = (b * c).astype(np.float32) + (a * s).astype(np.float32)
    y = np.concatenate([ya, yb], -1) if layout == "half" else np.stack([ya, yb], -1).reshape(xf.shape)
    return torch.from_numpy(np.ascontiguousarray(y)).to(x.dtype)


def tables(x: torch.Tensor, positions=None):
    return R._cos_sin(x.shape[-2], x.shape[-1], 10000.0, positions, x.device, torch.float32, x.shape)


def one_ulp_apart(a: torch.Tensor, b: torch.Tensor) -> bool:
    # One ulp: the spacing above the larger magnitude, ``nextafter(m, inf) - m`` in the dtype itself (eps * |v| would
    # allow almost two ulps just below a power of two); at 0 it is the smallest subnormal.
    m = torch.maximum(a.abs(), b.abs())
    ulp = (torch.nextafter(m, torch.full_like(m, float("inf"))) - m).float()
    return bool(((a.float() - b.float()).abs() <= ulp).all())


@needs_kernel
@pytest.mark.parametrize("dtype", LOWP, ids=str)
@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("d", [6, 16, 20, 128])
@pytest.mark.parametrize("shape", ["2d", "3d", "4d", "4d_transposed", "4d_per_example"])
def test_kernel_equals_float32_reference_bit_for_bit(dtype, layout, d, shape):
    g = torch.Generator().manual_seed(d)
    pos = None
    if shape == "2d":
        x = torch.randn(37, d, generator=g)
    elif shape == "3d":
        x = torch.randn(3, 37, d, generator=g)
        pos = torch.randint(0, 5000, (3, 37), generator=g)
    elif shape == "4d":
        x = torch.randn(2, 3, 37, d, generator=g)
    elif shape == "4d_transposed":  # as MultiHeadAttention makes it: (B, S, H, d).transpose(1, 2)
        x = torch.randn(2, 37, 3, d, generator=g).transpose(1, 2)
    else:
        x = torch.randn(3, 2, 37, d, generator=g)
        pos = torch.randint(0, 5000, (3, 37), generator=g)
    x = (x * 3).to(dtype)
    cos, sin = tables(x, pos)
    out = apply_rope(x, pos, layout=layout)
    assert out.dtype == dtype and out.shape == x.shape
    ref = numpy_reference(x, cos, sin, layout)
    assert torch.equal(out, ref), f"max |diff| {(out.float() - ref.float()).abs().max().item()}"
    with K.disabled():
        fallback = apply_rope(x, pos, layout=layout)
    # PyTorch's operators may fuse a multiply and an add (one rounding instead of two) on some
    # CPUs and code paths: never more than one unit in the last place of the output
    assert one_ulp_apart(out, fallback)


@needs_kernel
@pytest.mark.parametrize("dtype", LOWP, ids=str)
@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_kernel_backward_is_the_inverse_rotation(dtype, layout):
    g = torch.Generator().manual_seed(1)
    x64 = torch.randn(2, 3, 29, 20, generator=g, dtype=torch.float64)
    pos = torch.randint(0, 3000, (2, 29), generator=g)
    w = torch.randn(2, 3, 29, 20, generator=g, dtype=torch.float64)
    x = x64.to(dtype).requires_grad_()
    (apply_rope(x, pos, layout=layout).double() * w).sum().backward()
    xr = x.detach().double().requires_grad_()
    (apply_rope(xr, pos, layout=layout) * w).sum().backward()  # float64 autograd reference
    torch.testing.assert_close(x.grad.double(), xr.grad, atol=2 * torch.finfo(dtype).eps * 4, rtol=torch.finfo(dtype).eps)
    # and the gradient of the operator fallback (autograd through upcast, rotate, round)
    xf = x.detach().clone().requires_grad_()
    with K.disabled():
        (apply_rope(xf, pos, layout=layout).double() * w).sum().backward()
    assert one_ulp_apart(x.grad, xf.grad)


@needs_kernel
def test_kernel_threads_agree_and_special_values_propagate():
    x = torch.randn(1, 8, 300, 128).bfloat16()  # 307200 elements: several threads
    x[0, 0, 0, 0], x[0, 0, 1, 5], x[0, 0, 2, 64] = float("nan"), float("inf"), float("-inf")
    cos, sin = tables(x)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = apply_rope(x)
        torch.set_num_threads(max(2, threads))
        many = apply_rope(x)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one.view(torch.int16), many.view(torch.int16))
    ref = numpy_reference(x, cos, sin, "interleaved")
    assert torch.equal(one.isnan(), ref.isnan())
    finite = ~ref.isnan()
    assert torch.equal(one[finite], ref[finite])
    assert one[0, 0, 0, :2].isnan().all()  # position 0 rotates by angle 0, but NaN * 0 is NaN: the pair is NaN


def test_fused_rope_refuses_what_it_cannot_do():
    x = torch.randn(2, 5, 8)
    cos, sin = tables(x)
    for fn in (K.fused_rope, K.fused_rope_own_threads):
        with pytest.raises(ValueError, match="layout must be 'interleaved' or 'half', got 'pairs'"):
            fn(x.bfloat16(), cos, sin, "pairs")
        with pytest.raises(ValueError, match="the fused kernel does not apply here"):
            fn(x, cos, sin, "interleaved")  # float32 input: not the kernel's job
    assert not K.can_use(x.bfloat16(), cos.double(), sin.double())  # tables must be float32
    assert not K.can_use(x.bfloat16()[..., ::2].clone()[..., :3], cos[..., :1], sin[..., :1])  # odd head dim
    assert not K.can_use(x.bfloat16().unsqueeze(0).unsqueeze(0), cos, sin)  # 5 dimensions: the fallback
    assert not K.can_use(x.bfloat16().to("meta"), cos, sin)
    assert not K.can_use(x.bfloat16(), cos.requires_grad_(), sin)  # learned angles: autograd through the fallback


def test_status_names_the_reason():
    assert "not used for torch.float32" in K.status(torch.float32)
    with K.disabled():
        assert K.status(torch.bfloat16) == "not used: inside helpers.rope_kernel.disabled()"
        x = torch.randn(4, 8).bfloat16()
        assert not K.can_use(x, *tables(x))


def _run(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **env})


CHILD = """
import torch
from helpers import rope_kernel as K
from helpers.rope import apply_rope
x = torch.randn(2, 3, 7, 16).bfloat16()
with K.disabled():
    ref = apply_rope(x)
assert torch.equal(apply_rope(x), ref)
print(K.status(torch.bfloat16))
"""


def test_without_a_working_compiler_apply_rope_falls_back():
    broken = _run(CHILD, CC="false")  # `false` exists and fails: the compile step fails
    assert broken.returncode == 0, broken.stderr
    assert broken.stdout.strip().startswith("not used: compiling the kernel with"), broken.stdout
    off = _run(CHILD, HELPERS_FUSED_ROPE="0")
    assert off.returncode == 0, off.stderr
    assert off.stdout.strip() == "not used: HELPERS_FUSED_ROPE=0"


@needs_kernel
def test_kernel_in_forked_sweep_workers():
    """helpers.lab.sweep's forked workers run at one thread, so the kernel opens no parallel region there
    (after the parent used the OpenMP pool, a region in a forked child hangs, as PyTorch's own
    operators do). 262144 elements: with two threads the kernel would open one. In a child process
    with a timeout, so that a regression fails instead of hanging the suite."""
    code = """
import torch
from helpers import rope_kernel as K
from helpers.rope import apply_rope
from helpers.lab.sweep import sweep
torch.set_num_threads(2)
apply_rope(torch.randn(1, 8, 256, 128).bfloat16())  # the parent uses the pool first

def fn(seed):
    x = torch.randn(1, 8, 256, 128).bfloat16()
    with K.disabled():
        ref = apply_rope(x)
    return float(torch.equal(apply_rope(x), ref)) + 10 * torch.get_num_threads()

print([float(v) for v in sweep(fn, seeds=[0, 1, 2], workers=2).values()])
"""
    res = _run(code)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == "[11.0, 11.0, 11.0]", res.stdout


@needs_kernel
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")  # torch's own jvp decompositions
def test_forward_mode_ad_and_vmap():
    """Forward-mode AD rotates the tangent like the input (the kernel's jvp); vmap gets the fallback."""
    import torch.autograd.forward_ad as fwAD

    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 5, 16, generator=g).bfloat16()
    t = torch.randn(2, 3, 5, 16, generator=g).bfloat16()
    with fwAD.dual_level():
        tangent = fwAD.unpack_dual(apply_rope(fwAD.make_dual(x, t))).tangent
    assert torch.equal(tangent, apply_rope(t))
    assert torch.equal(torch.func.vmap(apply_rope)(x), apply_rope(x))


def test_tables_must_hold_one_value_per_pair():
    """A (seq, 1) table broadcasts in PyTorch but the C loop reads d/2 values per row: refused."""
    x = torch.randn(2, 7, 16).bfloat16()
    cos, sin = tables(x)
    assert K.can_use(x, cos, sin)
    assert not K.can_use(x, cos[..., :1], sin[..., :1])
    with pytest.raises(ValueError, match="does not apply here"):
        K.fused_rope(x, cos[..., :1].contiguous(), sin[..., :1].contiguous(), "interleaved")


@needs_kernel
def test_nan_in_a_table_stays_nan():
    x = torch.randn(1, 3, 16).bfloat16()
    cos, sin = tables(x)
    cos = cos.clone()
    cos.view(torch.int32)[1, 2] = 0x7FFFFFFF  # a NaN whose low half is not zero
    out = K.fused_rope(x, cos, sin, "interleaved")
    assert out[0, 1, 4:6].isnan().all() and not out[0, 0].isnan().any()


@needs_kernel
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_second_derivatives_and_angle_tangents_match_the_fallback():
    import torch.autograd.forward_ad as fwAD

    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 2, 6, 16, generator=g).bfloat16()
    pos = torch.arange(6) + 7

    def grad_penalty():
        xr = x.clone().requires_grad_()
        y = apply_rope(xr, pos)
        (gx,) = torch.autograd.grad(y.float().square().sum(), xr, create_graph=True)
        (ggx,) = torch.autograd.grad(gx.float().square().sum(), xr)
        return ggx

    fused = grad_penalty()
    with K.disabled():
        ops = grad_penalty()
    assert one_ulp_apart(fused, ops) or torch.allclose(fused.float(), ops.float(), rtol=2e-2, atol=2e-2)
    theta = R.rope_frequencies(16)
    tangent = torch.randn(8, generator=g)
    results = []
    for ctx in (K.disabled, lambda: __import__("contextlib").nullcontext()):
        with ctx(), fwAD.dual_level():
            out = apply_rope(x, pos, frequencies=fwAD.make_dual(theta, tangent))
            results.append(fwAD.unpack_dual(out).tangent)
    assert results[1] is not None and results[1].abs().max() > 0.1  # the angles' tangent is not dropped
    torch.testing.assert_close(results[1].float(), results[0].float(), atol=0.1, rtol=0.05)


def test_cache_folder_must_be_private(tmp_path, monkeypatch):
    monkeypatch.setattr(K.tempfile, "gettempdir", lambda: str(tmp_path))
    uid = os.getuid() if hasattr(os, "getuid") else "u"
    shared = tmp_path / f"attention-notebooks-kernels-{uid}"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o777)  # writable by others: not used
    chosen = K._private_folder()
    assert chosen != shared and chosen.parent == tmp_path and (os.stat(chosen).st_mode & 0o077) == 0
    os.chmod(shared, 0o700)
    assert K._private_folder() == shared


def _mapped_openmp_runtimes() -> set:
    """The OpenMP runtime files mapped into this process (Linux)."""
    maps = Path("/proc/self/maps").read_text().splitlines()
    return {line.split()[-1] for line in maps if line.split() and any(
        n in Path(line.split()[-1]).name for n in ("libgomp", "libomp", "libiomp"))}


@needs_kernel
@pytest.mark.skipif(not K._torch_libgomp(), reason="PyTorch here does not run on GNU OpenMP loaded as libgomp.so.1")
def test_kernel_runs_on_pytorchs_own_openmp_pool():
    """With GCC and PyTorch on libgomp.so.1 the kernel is built with -fopenmp and binds to the runtime
    torch already loaded: in a fresh process no OpenMP runtime appears when the kernel is loaded, and
    torch.set_num_threads(k) changes the thread count the kernel's own runtime reports (it would not
    for a second runtime). Threads of its own, or a second pool, shared the cores with PyTorch's
    spinning workers: 2.7-3.1x x.clone() instead of 1.0-1.6x, measured (CONTRIBUTING.md)."""
    code = """
import subprocess, torch
from pathlib import Path
def runtimes():
    return {l.split()[-1] for l in Path("/proc/self/maps").read_text().splitlines()
            if l.split() and any(n in Path(l.split()[-1]).name for n in ("libgomp", "libomp", "libiomp"))}
torch.randn(4).exp()
before = runtimes()
from helpers import rope_kernel as K
from helpers.rope import apply_rope
x = torch.randn(1, 8, 256, 128).bfloat16()
torch.set_num_threads(2)
out = apply_rope(x)
after = runtimes()
print("status:", K.status(torch.bfloat16))
print("runtimes unchanged:", after == before, len(after))
if K._lib is not None and K._lib.uses_openmp():
    seen = []
    for k in (1, 3, 2):
        torch.set_num_threads(k)
        seen.append(K._lib.runtime_max_threads())
    print("runtime threads follow torch:", seen)
"""
    res = _run(code)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.strip().splitlines()
    assert "runtimes unchanged: True 1" in lines, res.stdout
    version = subprocess.run([K._compiler(), "--version"], capture_output=True, text=True).stdout
    if K._is_gcc(version):
        assert "parallel on OpenMP (PyTorch's runtime)" in lines[0], res.stdout
        assert "runtime threads follow torch: [1, 3, 2]" in lines, res.stdout


@needs_kernel
def test_a_second_runtime_is_refused():
    """If the -fopenmp build's runtime does not follow torch.set_num_threads (a second OpenMP runtime),
    the kernel is built without OpenMP instead, and status() says why."""
    code = """
import torch
from helpers import rope_kernel as K
K._shares_torch_runtime = lambda lib: False
from helpers.rope import apply_rope
x = torch.randn(1, 8, 256, 128).bfloat16()
torch.set_num_threads(2)
with K.disabled():
    ref = apply_rope(x)
assert torch.equal(apply_rope(x), ref)
print(K.status(torch.bfloat16))
"""
    res = _run(code)
    assert res.returncode == 0, res.stderr
    status = res.stdout.strip()
    if K._torch_libgomp() and "OpenMP" in K.status(torch.bfloat16):
        assert "parallel on threads of its own (the -fopenmp build did not share PyTorch's OpenMP runtime)" in status, status


def test_kernel_with_threads_of_its_own():
    """Where the OpenMP build does not apply (clang, PyTorch on another runtime, not Linux) the kernel
    starts threads of its own: the same bits with one and with two threads."""
    code = """
import torch
from helpers import rope_kernel as K
K._torch_libgomp = lambda: False
from helpers.rope import apply_rope
torch.manual_seed(0)
x = torch.randn(1, 8, 256, 128).bfloat16()
torch.set_num_threads(1); one = apply_rope(x)
torch.set_num_threads(2); two = apply_rope(x, layout="half"); two_i = apply_rope(x)
with K.disabled():
    ref = apply_rope(x, layout="half")
assert torch.equal(one, two_i)
assert (one.float() - apply_rope(x.double()).float()).abs().max() < 0.05
fi = torch.finfo(torch.bfloat16)
ulp = torch.clamp(fi.eps * torch.maximum(two.float().abs(), ref.float().abs()), min=fi.tiny * fi.eps)
assert ((two.float() - ref.float()).abs() <= ulp).all()  # within one bf16 ulp of the operators (as one_ulp_apart)
print(K.status(torch.bfloat16))
"""
    res = _run(code)
    assert res.returncode == 0, res.stderr
    status = res.stdout.strip()
    if "used for" in status:
        assert "parallel on threads of its own" in status, status
    else:
        assert status.startswith("not used:"), status


@needs_kernel
def test_graph_node_only_where_a_derivative_can_be_asked_for():
    x = torch.randn(2, 3, 5, 16).bfloat16()
    assert apply_rope(x).grad_fn is None
    xg = x.clone().requires_grad_()
    assert type(apply_rope(xg).grad_fn).__name__ == "_FusedRopeBackward"
    with torch.no_grad():
        out = apply_rope(xg)
    assert out.grad_fn is None and not out.requires_grad
    with torch.inference_mode():
        assert torch.equal(apply_rope(xg), apply_rope(x))


def at_threads(n: int, fn, *args):
    """``fn(*args)`` with torch (and so the kernel) at ``n`` threads, the thread count restored after."""
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(n)
        return fn(*args)
    finally:
        torch.set_num_threads(threads)


def _case(kind: str, dtype: torch.dtype, g: torch.Generator):
    """x and float32 cos/sin tables for one layout of memory the kernel must handle (5 heads, 311
    positions, head dim 128: with 3 threads the rows split inside a head)."""
    M, S, D = 5, 311, 128
    ang = torch.rand(S, D // 2, generator=g) * 20
    if kind == "per-head tables":
        ang = torch.rand(M, S, D // 2, generator=g) * 20
    cos, sin = ang.cos(), ang.sin()
    if kind == "table rows strided":  # stride(-2) = D, not D/2: the per-row path
        wide = torch.rand(S, D, generator=g) * 20
        cos, sin = wide.cos()[:, : D // 2], wide.sin()[:, : D // 2]
    if kind == "seq-sliced x":  # a KV-cache view: rows end to end inside a head, heads 400 rows apart
        x = (3 * torch.randn(1, M, 400, D, generator=g)).to(dtype)[:, :, 37:37 + S]
    elif kind == "expanded x":  # one head's memory for all heads (stride 0)
        x = (3 * torch.randn(1, 1, S, D, generator=g)).to(dtype).expand(1, M, S, D)
    elif kind == "transposed x":  # (batch, seq, heads, d) memory viewed as (batch, heads, seq, d)
        x = (3 * torch.randn(1, S, M, D, generator=g)).to(dtype).transpose(1, 2)
    else:
        x = (3 * torch.randn(1, M, S, D, generator=g)).to(dtype)
    return x, cos, sin


@needs_kernel
@pytest.mark.parametrize("dtype", LOWP, ids=str)
@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("kind", ["contiguous", "seq-sliced x", "expanded x", "transposed x",
                                  "per-head tables", "table rows strided"])
def test_kernel_bit_exact_on_three_threads_and_every_memory_layout(dtype, layout, kind):
    g = torch.Generator().manual_seed(hash((kind, layout, str(dtype))) % 2**31)
    x, cos, sin = _case(kind, dtype, g)
    assert K.can_use(x, cos, sin)
    # 199040 elements: 3 threads, splits at rows 518 and 1036 (311 per head)
    out = at_threads(3, K.fused_rope, x, cos, sin, layout)
    assert torch.equal(out.view(torch.int16), numpy_reference(x, cos, sin, layout).view(torch.int16))


@needs_kernel
@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_float16_special_values(layout):
    """Overflow to inf (|x| near 65504 times a cosine and a sine adding up), subnormal inputs and
    outputs, signed zeros, inf and NaN: the same as float32 arithmetic rounded once."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(1, 2, 300, 64, generator=g) * 3
    x[0, 0, :20] = 60000.0                      # overflows when rotated by most angles
    x[0, 1, :20] = 3e-6                         # subnormal in float16 (below 6.1e-5)
    x[0, 1, 20, :4] = torch.tensor([0.0, -0.0, float("inf"), float("nan")])
    x = x.half()
    ang = torch.rand(300, 32, generator=g) * 20
    cos, sin = ang.cos(), ang.sin()
    out = at_threads(2, K.fused_rope, x, cos, sin, layout)
    ref = numpy_reference(x, cos, sin, layout)
    assert out.isinf().any() and torch.equal(out.isnan(), ref.isnan())
    finite = ~ref.isnan()
    assert torch.equal(out[finite].view(torch.int16), ref[finite].view(torch.int16))


@needs_kernel
@pytest.mark.parametrize("dtype", LOWP, ids=str)
@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_own_threads_build_equals_the_reference(dtype, layout):
    g = torch.Generator().manual_seed(11)
    x, cos, sin = _case("seq-sliced x", dtype, g)
    out = at_threads(3, K.fused_rope_own_threads, x, cos, sin, layout)
    assert torch.equal(out.view(torch.int16), numpy_reference(x, cos, sin, layout).view(torch.int16))


@needs_kernel
def test_a_lazily_negated_input_is_rotated_as_its_values():
    """A neg-bit tensor (private API) holds -x in its metadata and +x in memory: the kernel must not see it."""
    x = torch.randn(1, 2, 5, 8, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    neg = torch._neg_view(x)
    assert neg.is_neg()
    torch.testing.assert_close(apply_rope(neg), apply_rope(-x), atol=0, rtol=0)


def test_disabled_is_per_thread():
    import threading

    seen = {}
    inside, done = threading.Event(), threading.Event()

    def other():
        inside.wait(5)
        seen["other"] = K.status(torch.bfloat16)
        done.set()

    t = threading.Thread(target=other)
    t.start()
    with K.disabled():
        inside.set()
        done.wait(5)
        seen["here"] = K.status(torch.bfloat16)
    t.join(5)
    assert seen["here"] == "not used: inside helpers.rope_kernel.disabled()"
    assert seen["other"] != "not used: inside helpers.rope_kernel.disabled()"
