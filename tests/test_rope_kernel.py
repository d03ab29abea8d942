"""The opt-in fused float16/bfloat16 RoPE kernel (``helpers.lab.rope_kernel``) and its cache checks.

The reference for the forward pass is NumPy float32 arithmetic (each product and sum rounded to
float32, no fused multiply-add), rounded once to the output dtype by ``Tensor.to``: the kernel must
equal it bit for bit, on the vectorised part of a row and on its scalar tail (head dims 6, 16, 20,
128). ``helpers.apply_rope`` (PyTorch operators) must equal it in the interleaved layout and be within
one float32 rounding of it in the half layout (its ``addcmul_`` fuses a multiply and an add). The
cache folder, the library's owner and mode and the atomic build are checked at the end (that a fresh
process which never asks for the kernel loads none is ``tests/test_rope_lowp.py``). The whole-entry-point matrix (``fused_apply_rope`` rows) is
``tests/test_rope_matrix_entry_points.py``.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import rope as R
from helpers.lab import rope_kernel as K
from helpers.rope import apply_rope

LOWP = [torch.bfloat16, torch.float16]
ROOT = Path(__file__).resolve().parents[1]

needs_kernel = pytest.mark.skipif("available for" not in K.status(torch.bfloat16),
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
    """The float32 cos/sin of the angles apply_rope uses for ``x`` (``(..., seq, d/2)``)."""
    pos = R._positions_tensor(positions, x.shape[-2], x.device, torch.float32, x.shape)
    angle = pos[..., None] * R.rope_frequencies(x.shape[-1])
    return angle.cos(), angle.sin()


def one_rounding_apart(a: torch.Tensor, b: torch.Tensor, x: torch.Tensor) -> bool:
    """|a - b| <= one ulp of the output plus one float32 rounding of the pair's products (2^-23 max |x|
    per row): what a fused multiply-add (one rounding fewer) can change."""
    m = torch.maximum(a.abs(), b.abs())
    ulp = (torch.nextafter(m, torch.full_like(m, float("inf"))) - m).float()
    slack = 2.0**-23 * x.float().abs().amax(-1, keepdim=True)
    return bool(((a.float() - b.float()).abs() <= ulp + slack).all())


def at_threads(n: int, fn, *args, **kwargs):
    """``fn(...)`` with torch (and so the kernel) at ``n`` threads, the thread count restored after."""
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(n)
        return fn(*args, **kwargs)
    finally:
        torch.set_num_threads(threads)


def launch(x, cos, sin, layout, own_threads=False):
    """The C loop on given tables (the tests' way to feed it tables ``fused_apply_rope`` never builds)."""
    return K._launch(x, cos, sin, layout == "half", K._library(own_threads)[0])


# ------------------------------------------------------------------ the arithmetic
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
    out = K.fused_apply_rope(x, pos, layout=layout)
    assert out.dtype == dtype and out.shape == x.shape
    ref = numpy_reference(x, *tables(x, pos), layout)
    assert torch.equal(out, ref), f"max |diff| {(out.float() - ref.float()).abs().max().item()}"
    ops = apply_rope(x, pos, layout=layout)  # the default path, PyTorch operators
    if layout == "interleaved":
        assert torch.equal(ops, out)
    else:
        assert one_rounding_apart(ops, out, x)


@needs_kernel
@pytest.mark.parametrize("dtype", LOWP, ids=str)
@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_kernel_backward_is_the_inverse_rotation(dtype, layout):
    g = torch.Generator().manual_seed(1)
    x64 = torch.randn(2, 3, 29, 20, generator=g, dtype=torch.float64)
    pos = torch.randint(0, 3000, (2, 29), generator=g)
    w = torch.randn(2, 3, 29, 20, generator=g, dtype=torch.float64)
    x = x64.to(dtype).requires_grad_()
    (K.fused_apply_rope(x, pos, layout=layout).double() * w).sum().backward()
    xr = x.detach().double().requires_grad_()
    (apply_rope(xr, pos, layout=layout) * w).sum().backward()  # float64 autograd reference
    torch.testing.assert_close(x.grad.double(), xr.grad, atol=2 * torch.finfo(dtype).eps * 4, rtol=torch.finfo(dtype).eps)
    xo = x.detach().clone().requires_grad_()  # and the default path's gradient: the same bits
    (apply_rope(xo, pos, layout=layout).double() * w).sum().backward()
    assert torch.equal(x.grad, xo.grad)


@needs_kernel
def test_kernel_threads_agree_and_special_values_propagate():
    x = torch.randn(1, 8, 300, 128).bfloat16()  # 307200 elements: several threads
    x[0, 0, 0, 0], x[0, 0, 1, 5], x[0, 0, 2, 64] = float("nan"), float("inf"), float("-inf")
    one = at_threads(1, K.fused_apply_rope, x)
    many = at_threads(max(2, torch.get_num_threads()), K.fused_apply_rope, x)
    assert torch.equal(one.view(torch.int16), many.view(torch.int16))
    ref = numpy_reference(x, *tables(x), "interleaved")
    assert torch.equal(one.isnan(), ref.isnan())
    finite = ~ref.isnan()
    assert torch.equal(one[finite], ref[finite])
    assert one[0, 0, 0, :2].isnan().all()  # position 0 rotates by angle 0, but NaN * 0 is NaN: the pair is NaN


@needs_kernel
def test_nan_in_a_table_stays_nan():
    x = torch.randn(1, 3, 16).bfloat16()
    cos, sin = tables(x)
    cos = cos.clone()
    cos.view(torch.int32)[1, 2] = 0x7FFFFFFF  # a NaN whose low half is not zero
    out = launch(x, cos, sin, "interleaved")
    assert out[0, 1, 4:6].isnan().all() and not out[0, 0].isnan().any()


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
    # 199040 elements: 3 threads, splits at rows 518 and 1036 (311 per head)
    out = at_threads(3, launch, x, cos, sin, layout)
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
    out = at_threads(2, launch, x, cos, sin, layout)
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
    out = at_threads(3, launch, x, cos, sin, layout, own_threads=True)
    assert torch.equal(out.view(torch.int16), numpy_reference(x, cos, sin, layout).view(torch.int16))
    g = torch.Generator().manual_seed(12)
    x = (3 * torch.randn(1, 8, 256, 128, generator=g)).to(dtype)
    assert torch.equal(at_threads(2, K.fused_apply_rope, x, layout=layout, own_threads=True), K.fused_apply_rope(x, layout=layout))


# ------------------------------------------------------------------ autograd
@needs_kernel
def test_graph_node_only_where_a_derivative_can_be_asked_for():
    x = torch.randn(2, 3, 5, 16).bfloat16()
    assert K.fused_apply_rope(x).grad_fn is None
    xg = x.clone().requires_grad_()
    assert type(K.fused_apply_rope(xg).grad_fn).__name__ == "_FusedRopeBackward"
    with torch.no_grad():
        out = K.fused_apply_rope(xg)
    assert out.grad_fn is None and not out.requires_grad
    with torch.inference_mode():
        assert torch.equal(K.fused_apply_rope(xg), K.fused_apply_rope(x))


@needs_kernel
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")  # torch's own jvp decompositions
def test_forward_mode_ad_and_second_derivatives():
    """Forward-mode AD rotates the tangent like the input (the kernel's jvp); a gradient penalty
    (second derivative) runs through the kernel's backward, itself a kernel call."""
    import torch.autograd.forward_ad as fwAD

    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 5, 16, generator=g).bfloat16()
    t = torch.randn(2, 3, 5, 16, generator=g).bfloat16()
    with fwAD.dual_level():
        tangent = fwAD.unpack_dual(K.fused_apply_rope(fwAD.make_dual(x, t))).tangent
    assert torch.equal(tangent, K.fused_apply_rope(t))
    pos = torch.arange(5) + 7

    def grad_penalty(rotate):
        xr = x.clone().requires_grad_()
        (gx,) = torch.autograd.grad(rotate(xr, pos).float().square().sum(), xr, create_graph=True)
        (ggx,) = torch.autograd.grad(gx.float().square().sum(), xr)
        return ggx

    fused, ops = grad_penalty(K.fused_apply_rope), grad_penalty(apply_rope)
    torch.testing.assert_close(fused.float(), ops.float(), rtol=2e-2, atol=2e-2)


# ------------------------------------------------------------------ what it refuses, and why
def test_fused_apply_rope_refuses_what_it_cannot_do():
    x = torch.randn(2, 5, 8)
    with pytest.raises(ValueError, match=r"layout must be one of \('interleaved', 'half'\), got 'pairs'"):
        K.fused_apply_rope(x.bfloat16(), layout="pairs")
    with pytest.raises(ValueError, match="head_dim \\(x.shape\\[-1\\]\\) must be even"):
        K.fused_apply_rope(torch.randn(2, 5, 7).bfloat16())
    for bad, why in [(x, "the kernel is for float16/bfloat16"),
                     (x.bfloat16().unsqueeze(0).unsqueeze(0), "2 to 4 dimensions"),
                     (x.bfloat16().to("meta"), "CPU tensor"),
                     (torch.randn(2, 5, 16).bfloat16()[..., ::2], "contiguous last dimension"),
                     (torch._neg_view(x.bfloat16()), "lazily negated")]:
        with pytest.raises(ValueError, match=f"the fused kernel does not apply here: .*{why}"):
            K.fused_apply_rope(bad)
    with pytest.raises(ValueError, match="torch.func transform"):
        torch.func.vmap(K.fused_apply_rope)(x.bfloat16()[None])
    assert "not for torch.float32" in K.status(torch.float32)


def _run(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **env})


def test_without_a_working_compiler_the_kernel_says_why(tmp_path, monkeypatch):
    """In this process with the module's loaded libraries forgotten (as in a process that never loaded
    one) and the real ``cache_folder()`` under ``$XDG_CACHE_HOME``."""
    monkeypatch.setenv("CC", "false")  # `false` exists and fails: the compile step fails
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(K, "_built", {})
    x = torch.randn(2, 3, 7, 16).bfloat16()
    apply_rope(x)                      # the default path needs no compiler
    text = K.status(torch.bfloat16)
    assert text.startswith("not available: compiling the kernel with"), text
    with pytest.raises(K.KernelUnavailable) as refused:
        K.fused_apply_rope(x)
    assert str(refused.value).startswith("compiling the kernel with"), str(refused.value)
    assert [p.name for p in (tmp_path / "attention-notebooks").iterdir()] == []  # nothing left behind


def test_on_windows_it_is_refused_with_a_reason(tmp_path, monkeypatch):
    """In this process, as above; ``sys.platform`` reads "win32" only while ``status()`` runs."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(K, "_built", {})
    with monkeypatch.context() as m:
        m.setattr(sys, "platform", "win32")
        text = K.status(torch.bfloat16)
    assert text.startswith("not available: not on Windows"), text
    assert not (tmp_path / "attention-notebooks").exists()  # no folder made, none to leak


@needs_kernel
def test_kernel_in_forked_sweep_workers():
    """helpers.lab.sweep's forked workers run at one thread, so the kernel opens no parallel region there
    (after the parent used the OpenMP pool, a region in a forked child hangs, as PyTorch's own
    operators do). 262144 elements: with two threads the kernel would open one. In a child process
    with a timeout, so that a regression fails instead of hanging the suite."""
    code = """
import torch
from helpers.lab.rope_kernel import fused_apply_rope
from helpers.rope import apply_rope
from helpers.lab.sweep import sweep
torch.set_num_threads(2)
fused_apply_rope(torch.randn(1, 8, 256, 128).bfloat16())  # the parent uses the pool first

def fn(seed):
    x = torch.randn(1, 8, 256, 128).bfloat16()
    return float(torch.equal(fused_apply_rope(x), apply_rope(x))) + 10 * torch.get_num_threads()

print([float(v) for v in sweep(fn, seeds=[0, 1, 2], workers=2).values()])
"""
    res = _run(code)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == "[11.0, 11.0, 11.0]", res.stdout


# ------------------------------------------------------------------ threads
# One fresh process for two facts about loading the builds: the pool build binds to PyTorch's OpenMP
# runtime (test_kernel_runs_on_pytorchs_own_openmp_pool's lines), then the own-threads build loads as
# a second library (test_both_builds_in_one_process_are_two_libraries' line, the last one).
_FRESH_PROCESS_BUILDS = """
import subprocess, torch
from pathlib import Path
def runtimes():
    return {l.split()[-1] for l in Path("/proc/self/maps").read_text().splitlines()
            if l.split() and any(n in Path(l.split()[-1]).name for n in ("libgomp", "libomp", "libiomp"))}
torch.randn(4).exp()
before = runtimes()
torch.set_num_threads(2)
real_set = torch.set_num_threads
def refuse(k):
    raise AssertionError("the kernel changed torch's thread count")
torch.set_num_threads = refuse
from helpers.lab import rope_kernel as K
out = K.fused_apply_rope(torch.randn(1, 8, 256, 128).bfloat16())
print("status:", K.status(torch.bfloat16))
print("threads still:", torch.get_num_threads())
torch.set_num_threads = real_set
after = runtimes()
print("runtimes unchanged:", after == before, len(after))
lib = K._library()[0]
if lib.uses_openmp():
    seen = []
    for k in (1, 3, 2):
        torch.set_num_threads(k)
        seen.append(lib.runtime_max_threads())
    print("runtime threads follow torch:", seen)
pool, own = K._library()[0], K._library(own_threads=True)[0]  # the pool build, then the own-threads build
print("two builds:", pool.uses_openmp(), own.uses_openmp(), pool._handle != own._handle)
"""


@pytest.fixture(scope="module")
def fresh_process_builds() -> subprocess.CompletedProcess:
    """``_FRESH_PROCESS_BUILDS`` run once, in a fresh process; the two tests below read its output."""
    return _run(_FRESH_PROCESS_BUILDS)


@needs_kernel
@pytest.mark.skipif(K._torch_libgomp() is None, reason="PyTorch here does not run on GNU OpenMP loaded as libgomp.so.1")
def test_kernel_runs_on_pytorchs_own_openmp_pool(fresh_process_builds):
    """With GCC and PyTorch on libgomp.so.1 the kernel is built with -fopenmp and binds to the runtime
    torch already loaded: in a fresh process no OpenMP runtime appears when the kernel is loaded,
    torch.set_num_threads(k) changes the thread count the kernel's own runtime reports (it would not
    for a second runtime), and loading it never calls torch.set_num_threads (review finding 17)."""
    res = fresh_process_builds
    assert res.returncode == 0, res.stderr
    lines = res.stdout.strip().splitlines()
    assert "runtimes unchanged: True 1" in lines and "threads still: 2" in lines, res.stdout
    if K._is_gcc(K._compiler()[1]):
        assert "parallel on OpenMP (PyTorch's runtime)" in lines[0], res.stdout
        assert "runtime threads follow torch: [1, 3, 2]" in lines, res.stdout


@needs_kernel
def test_a_second_runtime_is_refused(monkeypatch):
    """If the -fopenmp build's runtime is not PyTorch's (a second OpenMP runtime), the kernel is built
    without OpenMP instead, and status() says why. In this process, with the module's loaded libraries
    forgotten (as in a process that never loaded one)."""
    here = K.status(torch.bfloat16)  # what this machine's real loader chose
    monkeypatch.setattr(K, "_built", {})
    monkeypatch.setattr(K, "_shares_torch_runtime", lambda lib: False)
    x = torch.randn(1, 8, 256, 128).bfloat16()
    assert torch.equal(at_threads(2, K.fused_apply_rope, x), apply_rope(x))
    text = K.status(torch.bfloat16)
    if K._torch_libgomp() and "OpenMP" in here:
        assert "parallel on threads of its own (the -fopenmp build did not share PyTorch's OpenMP runtime)" in text, text
        assert K._library()[0].uses_openmp() == 0  # the status describes the library in use


@needs_kernel
def test_both_builds_in_one_process_are_two_libraries(fresh_process_builds):
    """The pool build, then the own-threads build, in one fresh process: two libraries, each the one it says
    it is (a descriptor number reused for the second load would hand back the first library)."""
    here = K.status(torch.bfloat16)
    if "available for" not in here:
        pytest.skip(f"the kernel cannot be built here: {here}")
    res = fresh_process_builds
    assert res.returncode == 0, res.stderr
    # without the OpenMP build both calls compile the same flags into the same file: one library serves both
    expected = "1 0 True" if "OpenMP (PyTorch's runtime)" in here else "0 0 False"
    assert res.stdout.strip().splitlines()[-1] == f"two builds: {expected}", res.stdout


def test_kernel_with_threads_of_its_own(monkeypatch):
    """Where the OpenMP build does not apply (clang, PyTorch on another runtime, not Linux) the kernel
    starts threads of its own: the same bits with one and with two threads. In this process, with the
    module's loaded libraries forgotten."""
    monkeypatch.setattr(K, "_built", {})
    monkeypatch.setattr(K, "_torch_libgomp", lambda: None)
    x = torch.randn(1, 8, 256, 128, generator=torch.Generator().manual_seed(0)).bfloat16()
    status = K.status(torch.bfloat16)
    if "available for" in status:
        one = at_threads(1, K.fused_apply_rope, x)
        two = at_threads(2, K.fused_apply_rope, x)
        assert torch.equal(one, two) and torch.equal(one, apply_rope(x))
    assert "parallel on threads of its own" in status or status.startswith("not available:"), status


# ------------------------------------------------------------------ the cache: per user, private, atomic
@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh cache folder for this test (``cache_folder()`` redirected), the module's loaded libraries forgotten."""
    folder = tmp_path / "cache" / "attention-notebooks"
    monkeypatch.setattr(K, "cache_folder", lambda: folder)
    monkeypatch.setattr(K, "_built", {})
    return folder


def test_the_cache_is_a_per_user_folder(tmp_path, monkeypatch):
    """By default under the user's cache directory (XDG_CACHE_HOME here), not in a shared temp folder."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # read by platformdirs on each call
    assert K.cache_folder() == tmp_path / "attention-notebooks"


@needs_kernel
def test_the_cache_folder_is_created_private(cache):
    K._private_folder()
    st = os.lstat(cache)
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) & 0o077 == 0


@pytest.mark.parametrize("problem", ["group writable", "others writable", "symbolic link"])
def test_a_cache_folder_others_can_write_is_refused(cache, tmp_path, problem):
    if problem == "symbolic link":
        target = tmp_path / "elsewhere"
        target.mkdir(mode=0o700)
        cache.parent.mkdir(parents=True)
        cache.symlink_to(target)
    else:
        cache.mkdir(parents=True, mode=0o700)
        os.chmod(cache, 0o770 if problem == "group writable" else 0o707)
    with pytest.raises(K.KernelUnavailable, match="refusing the cache folder " + str(cache)):
        K._private_folder()
    assert "not available: refusing the cache folder" in K.status(torch.bfloat16)


def _build_library(cache: Path) -> Path:
    """The library ``K._library()`` builds into ``cache`` (the first, if it builds two)."""
    K._library()
    return sorted(p for p in cache.iterdir() if p.suffix == ".so")[0]


@pytest.fixture(scope="module")
def prebuilt(tmp_path_factory) -> tuple[list, list]:
    """The kernel built once for the tests that tamper with a library: ``(what K._library() builds into an
    empty cache folder, what K._library(own_threads=True) adds)``, in a folder of this module's. Tests
    about building itself (the rename, the umask, a failed build, a second process) build their own."""
    folder = tmp_path_factory.mktemp("built") / "attention-notebooks"
    with pytest.MonkeyPatch.context() as m:
        m.setattr(K, "cache_folder", lambda: folder)
        m.setattr(K, "_built", {})
        K._library()
        pool = sorted(p for p in folder.iterdir() if p.suffix == ".so")
        K._library(own_threads=True)
    return pool, sorted(p for p in folder.iterdir() if p.suffix == ".so" and p not in pool)


def _plant_library(cache: Path, prebuilt: tuple[list, list]) -> Path:
    """A real library, the one ``_build_library(cache)`` would return, copied into ``cache`` from the
    ``prebuilt`` folder; the test then tampers with its file. The own-threads build is copied too, so a
    refused pool build falls back to a library already in the cache instead of compiling it."""
    pool, extra = prebuilt
    K._private_folder()  # creates ``cache`` (mode 0o700, checked), as a build does
    for so in pool + extra:
        shutil.copy2(so, cache / so.name)  # the bytes and the mode (0o700); the owner is this user
    return cache / pool[0].name


@needs_kernel
@pytest.mark.parametrize("mode", [0o775, 0o757, 0o666])
def test_a_library_others_can_write_is_refused_and_named(cache, prebuilt, mode):
    so = _plant_library(cache, prebuilt)
    os.chmod(so, mode)
    with pytest.raises(K.KernelUnavailable, match=f"refusing the library {so}: owner uid .*, mode {mode:#o}"):
        K._open_checked(so)
    K._built.clear()  # as a new process finding that file in the cache: refused and named, never loaded
    assert f"refusing the library {so}" in K.status(torch.bfloat16)


@needs_kernel
def test_a_library_of_another_user_is_refused_and_named(cache, prebuilt, monkeypatch):
    so = _plant_library(cache, prebuilt)
    if os.getuid() == 0:  # root can give the file away: a real other owner
        os.chown(so, 12345, -1)
    else:  # otherwise this process pretends to be another user (the folder check is not reached)
        real = os.getuid()
        monkeypatch.setattr(K.os, "getuid", lambda: real + 1)
    with pytest.raises(K.KernelUnavailable, match=f"refusing the library {so}: owner uid \\d+ \\(this user is \\d+\\)"):
        K._open_checked(so)


@needs_kernel
def test_a_symbolic_link_in_place_of_the_library_is_refused(cache, prebuilt):
    so = _plant_library(cache, prebuilt)
    real = so.with_name("real.so")
    so.rename(real)
    so.symlink_to(real)
    with pytest.raises(K.KernelUnavailable, match=f"refusing the library {so}"):
        K._open_checked(so)


@needs_kernel
def test_the_library_is_built_under_a_temporary_name_and_renamed(cache, monkeypatch):
    """os.replace moves a finished file from a temporary name in the same folder onto the final name, which
    did not exist yet: another process sees the whole library or none. Nothing else is left behind."""
    renames = []
    real_replace = os.replace

    def record(src, dst):
        src, dst = Path(src), Path(dst)
        renames.append((src, dst, src.stat().st_size, dst.exists()))
        real_replace(src, dst)

    monkeypatch.setattr(K.os, "replace", record)
    K._library()
    assert renames, "the library was not built"
    for src, dst, size, existed in renames:
        assert src.parent == dst.parent == cache and src.name.startswith(".rope_lowp_") and src.name.endswith(".tmp")
        assert dst.name.startswith("rope_lowp_") and dst.suffix == ".so" and size > 0 and not existed
    assert sorted(p.name for p in cache.iterdir()) == sorted(dst.name for _, dst, _, _ in renames)
    for _, dst, _, _ in renames:
        assert stat.S_IMODE(os.stat(dst).st_mode) & 0o022 == 0


@needs_kernel
def test_a_library_built_under_a_permissive_umask_is_private(cache, monkeypatch, tmp_path):
    """A linker that writes its output as a new file (lld, ld64; GNU ld keeps the temporary file's mode)
    gives it 0o775 under umask 0o002: the build sets 0o700 itself, so the library passes its own check."""
    cc = tmp_path / "cc-new-output"
    cc.write_text('#!/bin/sh\nprev=\nfor a; do [ "$prev" = -o ] && rm -f "$a"; prev=$a; done\n'
                  f'exec {K._compiler()[0]} "$@"\n')
    cc.chmod(0o755)
    monkeypatch.setenv("CC", str(cc))
    old = os.umask(0o002)
    try:
        so = _build_library(cache)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(so).st_mode) & 0o022 == 0


def _mapping_inode(address: int) -> int:
    """The inode of the file mapped at ``address`` in this process (``/proc/self/maps``)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        span, _, _, _, inode = line.split()[:5]
        lo, hi = (int(a, 16) for a in span.split("-"))
        if lo <= address < hi:
            return int(inode)
    raise AssertionError(f"nothing mapped at {address:#x}")


@needs_kernel
@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="loading through the open file is Linux's /proc/self/fd")
def test_the_file_checked_is_the_file_loaded(cache, prebuilt, monkeypatch):
    """A file put in the library's place after the owner/mode check is not what gets loaded: the mapped
    code is the checked open file's inode (loading by path would map the file swapped in)."""
    built = _plant_library(cache, prebuilt)
    fresh, swapped = built.with_name("fresh.so"), built.with_name("swapped.so")
    shutil.copy(built, fresh)  # the same bytes under a name never loaded, and another inode to swap in
    shutil.copy(built, swapped)
    real_check = K._check_private

    def check_then_swap(st, path, what):
        real_check(st, path, what)
        if what == "the library":
            os.replace(swapped, fresh)

    monkeypatch.setattr(K, "_check_private", check_then_swap)
    lib = K._open_checked(fresh)
    checked = os.fstat(lib._checked_fd).st_ino
    assert os.stat(fresh).st_ino != checked  # the path now names the file swapped in
    assert _mapping_inode(ctypes.cast(lib.rope_lowp, ctypes.c_void_p).value) == checked


def test_a_failed_build_leaves_nothing_behind(cache, monkeypatch):
    monkeypatch.setenv("CC", "false")
    with pytest.raises(K.KernelUnavailable, match="compiling the kernel with .*false failed"):
        K._library()
    assert list(cache.iterdir()) == []


@needs_kernel
def test_a_second_process_reuses_the_cached_library(tmp_path, monkeypatch):
    """No rebuild per process: a second process with the same cache runs the compiler only for ``--version``.
    The first process is this one, with the module's loaded libraries forgotten (as in a process that
    never loaded one) and the real ``cache_folder()`` under ``$XDG_CACHE_HOME``."""
    log = tmp_path / "cc.log"
    cc = tmp_path / "cc-logged"
    cc.write_text(f'#!/bin/sh\necho "$@" >> {log}\nexec {K._compiler()[0]} "$@"\n')
    cc.chmod(0o755)
    code = "import torch; from helpers.lab import rope_kernel as K; print(K.status(torch.bfloat16))"
    env = {"CC": str(cc), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(K, "_built", {})
    first = K.status(torch.bfloat16)
    assert "available for" in first, first
    compiles = [line for line in log.read_text().splitlines() if "--version" not in line]
    assert compiles, "the first process compiled nothing"
    log.write_text("")
    second = _run(code, **env)
    assert second.returncode == 0 and second.stdout == first + "\n", second.stdout + second.stderr
    assert [line for line in log.read_text().splitlines() if "--version" not in line] == []
