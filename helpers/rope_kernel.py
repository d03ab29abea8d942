r"""A fused RoPE kernel for float16/bfloat16 input on the CPU: one pass over memory.

Taught in ``notebooks/appendix/02a_rope_cost_on_a_cpu.ipynb`` (§3, *bfloat16 and float16*) and used by
:func:`helpers.apply_rope` whenever it can be (see :func:`status`).

Why it exists. In eager PyTorch every element-wise operator is one pass over memory, and
on a CPU without native bfloat16 arithmetic each pass also converts every element to
float32 and back. Measured on a 2-core AVX2 CPU at ``(1, 8, 4096, 128)`` (``benchmarks/
rope_bench.py``, ``CONTRIBUTING.md``): one bfloat16 multiply ``x * 2`` takes 0.8-2.5x the time
of ``x.clone()``, the best composition of PyTorch operators for bfloat16 RoPE (upcast, rotate
in float32, round back, as Meta's Llama does) about 5x, and the half layout about 9x;
``torch.compile`` of the same formula about 4.5x (half layout) and 7x (interleaved). This
kernel: 1.0-1.6x in both dtypes and layouts, with or without gradients, where it runs on
PyTorch's OpenMP pool (see *Threads*), in the benchmark's interleaved calls (the other
implementations between two calls push ``x`` out of the CPU's caches, so every call reads it
from memory). Run alone in a loop, ``x`` and the output stay in the 32 MiB L3 cache, the clone
is about 3 times faster (2.6-3.6) and the kernel 2-4x it; what limits it there (its arithmetic,
or the float32 table it reads once per head, twice the bytes of ``x``) is not settled. The rotation itself is
arithmetic on data already in registers; what costs is passes over memory. So this module
compiles (once per machine, with the system's C compiler, in about 0.3 s) a short C loop
(about two hundred lines with its AVX2 vector code) that reads each pair once, widens it to
float32, rotates it with float32 ``cos``/``sin``, rounds once (round to nearest even, as
``Tensor.to`` does) and writes it once:

.. math::
    y_a = \mathrm{rd}(x_a\cos\phi - x_b\sin\phi), \qquad
    y_b = \mathrm{rd}(x_b\cos\phi + x_a\sin\phi)

which is exactly what Meta's approach computes (each product and sum in float32, one
rounding ``rd`` to ``x.dtype`` per output), so the two agree bit for bit
(``tests/test_rope_kernel.py``). The backward pass is the inverse rotation (the same
kernel with :math:`-\sin\phi`): RoPE is orthogonal, so :math:`\partial L/\partial x =
R^\top\, \partial L/\partial y`.

When it is not used, :func:`helpers.apply_rope` computes the same numbers with PyTorch
operators (slower): no C compiler (``cc``, ``gcc`` or ``clang``, or ``$CC``), a non-CPU
device, tensors that need gradients for ``cos``/``sin`` (learned frequencies), more than
four dimensions, a last dimension that is not contiguous, or the environment variable
``HELPERS_FUSED_ROPE=0``. :func:`status` says which applies. The kernel sits outside
PyTorch's dispatcher (it is called through ``ctypes`` on the tensors' memory), so
``torch.compile`` and ``torch.func`` transforms (``vmap``, ...) get the operator fallback
(their tensors have no memory to hand over); forward-mode AD (``torch.autograd.forward_ad``)
uses the kernel, rotating the tangent like the input.

Threads. Where PyTorch runs its operators on GNU OpenMP (``libgomp.so.1``, Linux wheels) and the
compiler is GCC, the loop is built with ``-fopenmp`` and so runs on PyTorch's own OpenMP thread
pool (the loader binds it to the ``libgomp.so.1`` torch already loaded): the pool's workers
spin for a while after every PyTorch operator, and a thread of the kernel's own, started per
call, then shared the two cores with them: the same loop took 2.7-3.1x ``x.clone()`` that way
and 1.0-1.6x on the pool (same machine, same runs, idle; ``CONTRIBUTING.md``; on a machine busy
with other jobs the ordering can flip, as every call on the pool then waits at its barriers).
The build is checked after loading: ``torch.set_num_threads`` must change the thread count the
kernel's runtime reports, or the kernel falls back to threads of its own. Elsewhere (clang, macOS, another runtime) it
starts threads of its own. As with PyTorch's own operators on OpenMP, a forked child must call
``torch.set_num_threads(1)`` before using it (:func:`helpers.sweep` does); with one thread the
kernel opens no parallel region.
"""
from __future__ import annotations

import contextlib
import contextvars
import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Iterator, Optional

import torch

__all__ = ["fused_rope", "fused_rope_own_threads", "can_use", "status", "disabled"]

_SOURCE = r"""
#include <stdint.h>
#include <string.h>
#include <pthread.h>
#ifdef _OPENMP
#include <omp.h>
int uses_openmp(void) { return 1; }
/* the thread count the kernel's OpenMP runtime would use: follows torch.set_num_threads only if that
   runtime is PyTorch's own (checked after loading, see _shares_torch_runtime) */
int runtime_max_threads(void) { return omp_get_max_threads(); }
#else
int uses_openmp(void) { return 0; }
int runtime_max_threads(void) { return -1; }
#endif

static inline float bf2f(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
/* c10::BFloat16's round_to_nearest_even, NaN -> 0x7FC0 */
static inline uint16_t f2bf(float f) {
    uint32_t u; memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
#ifdef __FLT16_MAX__
static inline float h2f(uint16_t h) { _Float16 v; memcpy(&v, &h, 2); return (float)v; }
static inline uint16_t f2h(float f) { _Float16 v = (_Float16)f; uint16_t h; memcpy(&h, &v, 2); return h; }
int has_float16(void) { return 1; }
#else
int has_float16(void) { return 0; }
#endif

typedef struct {
    const uint16_t *x; int64_t xs0, xs1, xs2;
    const float *c, *s; int64_t cs0, cs1, cs2;
    uint16_t *out; int64_t B, M, S, D;
    int half, f16; float sign; int64_t r0, r1;
} job_t;

#if defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>
#define HAVE_VEC 1
static inline __m256 bf8_to_f(const uint16_t *p) {  /* 8 bfloat16 -> 8 float32 (exact) */
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
static inline __m256i f_round_bf(__m256 f) {  /* float32 bits rounded to nearest even at bit 16, NaN -> 0x7FC0xxxx */
    __m256i u = _mm256_castps_si256(f);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(f, f, _CMP_UNORD_Q));
    return _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fc00000), nan);
}
static inline void f_to_bf8(uint16_t *p, __m256 f) {  /* 8 float32 -> 8 bfloat16 */
    __m256i r = _mm256_srli_epi32(f_round_bf(f), 16);
    __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0xD8);
    _mm_storeu_si128((__m128i *)p, _mm256_castsi256_si128(packed));
}
static inline __m256 h8_to_f(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
static inline void f_to_h8(uint16_t *p, __m256 f) {
    _mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
#else
#define HAVE_VEC 0
#endif

/* h pairs: x at xr, their cos/sin at c/sn (h each), output at o. half/f16 are constants at every
   call site (see run_rows), so the compiler makes one copy per layout and dtype, with no branch
   inside the loops. In the interleaved layout h may span several rows (pairs never straddle one). */
static inline __attribute__((always_inline)) void do_pairs(const uint16_t *restrict xr, const float *restrict c,
        const float *restrict sn, uint16_t *restrict o, const int64_t h, const int half, const int f16) {
    const float g = 1.0f;  /* the inverse rotation gets a negated sin table from Python */
    int64_t i = 0;
#if HAVE_VEC
    if (half) {  /* pairs (i, i + d/2): 8 pairs per step */
        for (; i + 8 <= h; i += 8) {
            __m256 a = f16 ? h8_to_f(xr + i) : bf8_to_f(xr + i);
            __m256 bb = f16 ? h8_to_f(xr + i + h) : bf8_to_f(xr + i + h);
            __m256 cv = _mm256_loadu_ps(c + i), sv = _mm256_loadu_ps(sn + i);
            __m256 ya = _mm256_sub_ps(_mm256_mul_ps(a, cv), _mm256_mul_ps(bb, sv));
            __m256 yb = _mm256_add_ps(_mm256_mul_ps(bb, cv), _mm256_mul_ps(a, sv));
            if (f16) { f_to_h8(o + i, ya); f_to_h8(o + i + h, yb); }
            else { f_to_bf8(o + i, ya); f_to_bf8(o + i + h, yb); }
        }
    } else if (!f16) {  /* bfloat16 pairs (2i, 2i+1) as 32-bit words: 8 pairs per step */
        for (; i + 8 <= h; i += 8) {
            __m256i u = _mm256_loadu_si256((const __m256i *)(xr + 2 * i));
            __m256 a = _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
            __m256 bb = _mm256_castsi256_ps(_mm256_and_si256(u, _mm256_set1_epi32((int)0xffff0000u)));
            __m256 cv = _mm256_loadu_ps(c + i), sv = _mm256_loadu_ps(sn + i);
            __m256 ya = _mm256_sub_ps(_mm256_mul_ps(a, cv), _mm256_mul_ps(bb, sv));
            __m256 yb = _mm256_add_ps(_mm256_mul_ps(bb, cv), _mm256_mul_ps(a, sv));
            __m256i w = _mm256_or_si256(_mm256_srli_epi32(f_round_bf(ya), 16),
                                        _mm256_and_si256(f_round_bf(yb), _mm256_set1_epi32((int)0xffff0000u)));
            _mm256_storeu_si256((__m256i *)(o + 2 * i), w);
        }
    } else {  /* float16 pairs (2i, 2i+1): 8 pairs (16 numbers) per step */
        for (; i + 8 <= h; i += 8) {
            __m256 f0 = h8_to_f(xr + 2 * i), f1 = h8_to_f(xr + 2 * i + 8);  /* a0 b0 a1 b1 .. | a4 b4 .. */
            /* per 128-bit lane: a = (a0 a1 a4 a5 | a2 a3 a6 a7), b likewise; the tables in that order */
            __m256 a = _mm256_shuffle_ps(f0, f1, 0x88), bb = _mm256_shuffle_ps(f0, f1, 0xDD);
            __m256 cv = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_loadu_ps(c + i)), 0xD8));
            __m256 sv = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_loadu_ps(sn + i)), 0xD8));
            __m256 ya = _mm256_sub_ps(_mm256_mul_ps(a, cv), _mm256_mul_ps(bb, sv));
            __m256 yb = _mm256_add_ps(_mm256_mul_ps(bb, cv), _mm256_mul_ps(a, sv));
            f_to_h8(o + 2 * i, _mm256_unpacklo_ps(ya, yb));      /* pairs 0-3, in order */
            f_to_h8(o + 2 * i + 8, _mm256_unpackhi_ps(ya, yb));  /* pairs 4-7 */
        }
    }
#endif
    if (!f16) {
        if (half) {
            for (; i < h; ++i) {
                float a = bf2f(xr[i]), bb = bf2f(xr[i + h]), si = g * sn[i];
                o[i] = f2bf(a * c[i] - bb * si); o[i + h] = f2bf(bb * c[i] + a * si);
            }
        } else {  /* a pair (x[2i], x[2i+1]) is one 32-bit word: x[2i] in its low half (little-endian) */
            for (; i < h; ++i) {
                uint32_t u; memcpy(&u, xr + 2 * i, 4);
                uint32_t ua = u << 16, ub = u & 0xffff0000u; float a, bb; memcpy(&a, &ua, 4); memcpy(&bb, &ub, 4);
                float si = g * sn[i];
                uint32_t w = (uint32_t)f2bf(a * c[i] - bb * si) | ((uint32_t)f2bf(bb * c[i] + a * si) << 16);
                memcpy(o + 2 * i, &w, 4);
            }
        }
    }
#ifdef __FLT16_MAX__
    else if (half) {
        for (; i < h; ++i) {
            float a = h2f(xr[i]), bb = h2f(xr[i + h]), si = g * sn[i];
            o[i] = f2h(a * c[i] - bb * si); o[i + h] = f2h(bb * c[i] + a * si);
        }
    } else {
        for (; i < h; ++i) {
            float a = h2f(xr[2 * i]), bb = h2f(xr[2 * i + 1]), si = g * sn[i];
            o[2 * i] = f2h(a * c[i] - bb * si); o[2 * i + 1] = f2h(bb * c[i] + a * si);
        }
    }
#endif
}

/* Rows r0..r1 of one thread, in the output's memory order. Interleaved rows that lie end to end
   in x and in the table (the usual case) form one run of pairs per (b, m): no per-row overhead. */
static inline __attribute__((always_inline)) void rows_of(const job_t *j, const int half, const int f16) {
    const int64_t h = j->D / 2;
    int64_t b = j->r0 / (j->M * j->S), m = (j->r0 / j->S) % j->M, s = j->r0 % j->S;  /* (b, m, s) of row r */
    if (!half && j->xs2 == j->D && j->cs2 == h) {
        for (int64_t r = j->r0; r < j->r1; ) {
            int64_t n = j->S - s;
            if (n > j->r1 - r) n = j->r1 - r;
            do_pairs(j->x + b * j->xs0 + m * j->xs1 + s * j->xs2, j->c + b * j->cs0 + m * j->cs1 + s * j->cs2,
                     j->s + b * j->cs0 + m * j->cs1 + s * j->cs2, j->out + r * j->D, n * h, 0, f16);
            r += n; s = 0;
            if (++m == j->M) { m = 0; ++b; }
        }
        return;
    }
    for (int64_t r = j->r0; r < j->r1; ++r) {
        do_pairs(j->x + b * j->xs0 + m * j->xs1 + s * j->xs2, j->c + b * j->cs0 + m * j->cs1 + s * j->cs2,
                 j->s + b * j->cs0 + m * j->cs1 + s * j->cs2, j->out + r * j->D, h, half, f16);
        if (++s == j->S) { s = 0; if (++m == j->M) { m = 0; ++b; } }
    }
}

static void run_rows(const job_t *j) {
    if (j->half) { if (j->f16) rows_of(j, 1, 1); else rows_of(j, 1, 0); }
    else { if (j->f16) rows_of(j, 0, 1); else rows_of(j, 0, 0); }
}

#ifndef _OPENMP
static void *thread_main(void *arg) { run_rows((const job_t *)arg); return 0; }
#endif

/* x: (B, M, S, D) with strides xs0..xs2 (last stride 1); cos/sin: broadcast to (B, M, S, D/2) with
   strides cs0..cs2 (last stride 1), float32; out: contiguous (B, M, S, D). sign: +1 rotate, -1 inverse. */
int rope_lowp(const uint16_t *x, int64_t xs0, int64_t xs1, int64_t xs2,
              const float *c, const float *s, int64_t cs0, int64_t cs1, int64_t cs2,
              uint16_t *out, int64_t B, int64_t M, int64_t S, int64_t D,
              int half, int f16, float sign, int threads) {
    const int64_t rows = B * M * S;
    if (threads < 1) threads = 1;
    if (threads > 64) threads = 64;
    if ((int64_t)threads > rows) threads = rows > 0 ? (int)rows : 1;
    if (threads == 1) {  /* no parallel region at all (also safe in a forked child) */
        job_t j = {x, xs0, xs1, xs2, c, s, cs0, cs1, cs2, out, B, M, S, D, half, f16, sign, 0, rows};
        run_rows(&j);
        return 0;
    }
#ifdef _OPENMP
    /* PyTorch's own OpenMP runtime (the same libgomp.so.1, already loaded by torch): its worker
       threads, which spin for a while after each PyTorch operator, do this work instead of
       competing with threads of ours for the cores */
    #pragma omp parallel num_threads(threads)
    {
        const int t = omp_get_thread_num(), n = omp_get_num_threads();
        job_t j = {x, xs0, xs1, xs2, c, s, cs0, cs1, cs2, out, B, M, S, D, half, f16, sign,
                   rows * t / n, rows * (t + 1) / n};
        run_rows(&j);
    }
#else
    job_t jobs[64]; pthread_t tid[64]; int started[64] = {0};
    for (int t = 0; t < threads; ++t) {
        job_t j = {x, xs0, xs1, xs2, c, s, cs0, cs1, cs2, out, B, M, S, D, half, f16, sign,
                   rows * t / threads, rows * (t + 1) / threads};
        jobs[t] = j;
    }
    for (int t = 1; t < threads; ++t) started[t] = pthread_create(&tid[t], 0, thread_main, &jobs[t]) == 0;
    run_rows(&jobs[0]);
    for (int t = 1; t < threads; ++t) { if (started[t]) pthread_join(tid[t], 0); else run_rows(&jobs[t]); }
#endif
    return 0;
}
"""

_FLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fPIC", "-shared", "-pthread", "-std=c11"]
# -ffp-contract=off: no fused multiply-adds, so every product and sum is rounded to float32
# exactly as PyTorch's element-wise operators round them (the fallback gives the same bits).
_threading = "not loaded"  # "OpenMP (PyTorch's runtime)" or "threads of its own": said by status()


def _torch_libgomp() -> bool:
    """Whether this process runs PyTorch's operators on GNU OpenMP loaded as ``libgomp.so.1``: then
    a library built with ``-fopenmp`` (which asks for ``libgomp.so.1``) binds to that same, already
    loaded runtime and shares its thread pool (see the module docstring, *Threads*)."""
    if "parallel backend: OpenMP" not in torch.__config__.parallel_info():
        return False
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return False  # not Linux: keep threads of our own
    return any(line.rstrip().endswith("/libgomp.so.1") for line in maps.splitlines())


def _is_gcc(version: str) -> bool:
    """Whether ``cc --version`` names GCC (whose ``-fopenmp`` links ``libgomp.so.1``; clang's links
    its own ``libomp``, a second runtime)."""
    first = version.splitlines()[0].lower() if version.strip() else ""
    return "clang" not in version.lower() and ("gcc" in first or first.startswith("cc ")) and "Free Software Foundation" in version
_MIN_ELEMENTS_PER_THREAD = 1 << 16

_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_reason: Optional[str] = None  # why the kernel is unavailable (None: not tried yet, or available)
_tried = False
# How deep the current thread/context is inside ``disabled()`` blocks: per context, so a block in one thread does
# not switch the kernel off in another.
_disabled_depth: contextvars.ContextVar[int] = contextvars.ContextVar("helpers_rope_kernel_disabled", default=0)


def _compiler() -> Optional[str]:
    for cand in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if cand and shutil.which(cand):
            return shutil.which(cand)
    return None


def _cpu_fingerprint() -> str:
    """What the binary's ``-march=native`` depends on: the CPU's feature flags (a home folder
    shared by machines with different CPUs must not reuse another CPU's binary)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
        flags = next((line for line in text.splitlines() if line.startswith(("flags", "Features"))), "")
    except OSError:
        flags = ""
    return flags + platform.machine() + platform.processor()


def _private_folder() -> Path:
    """The folder the compiled kernel is kept in: ``<tmp>/attention-notebooks-kernels-<uid>``, used only
    if it is a real folder owned by this user and writable by nobody else (a library another user
    could plant there would run in this process); otherwise a fresh private folder for this process."""
    folder = Path(tempfile.gettempdir()) / f"attention-notebooks-kernels-{os.getuid() if hasattr(os, 'getuid') else 'u'}"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(folder)
        import stat as _stat
        if _stat.S_ISDIR(st.st_mode) and not _stat.S_ISLNK(st.st_mode) and (
                not hasattr(os, "getuid") or st.st_uid == os.getuid()) and not (st.st_mode & 0o022):
            return folder
    except OSError:
        pass
    return Path(tempfile.mkdtemp(prefix="attention-notebooks-kernels-"))


def _build(cc: str, version: str, flags: list) -> tuple:
    """Compile (or find already compiled) the kernel with ``flags``; ``(library, None)`` or
    ``(None, why not)``. The file name is a hash of everything the binary depends on."""
    key = hashlib.sha256("\0".join([_SOURCE, " ".join(flags), cc, version, _cpu_fingerprint()]).encode()).hexdigest()[:16]
    so = _private_folder() / f"rope_lowp_{key}.so"
    if not so.exists():
        try:
            with tempfile.TemporaryDirectory(dir=so.parent) as tmp:
                src, tmp_so = Path(tmp) / "rope_lowp.c", Path(tmp) / "rope_lowp.so"
                src.write_text(_SOURCE)
                proc = subprocess.run([cc, *flags, str(src), "-o", str(tmp_so)], capture_output=True, text=True, timeout=120)
                if proc.returncode != 0:
                    return None, f"compiling the kernel with {cc} failed: {proc.stderr.strip()[:300]}"
                os.replace(tmp_so, so)  # atomic: another process sees the whole file or none
        except (OSError, subprocess.SubprocessError) as err:
            return None, f"compiling the kernel failed: {err}"
    try:
        lib = ctypes.CDLL(str(so))
    except OSError as err:
        return None, f"loading the compiled kernel failed: {err}"
    lib.rope_lowp.restype = ctypes.c_int
    lib.rope_lowp.argtypes = (
        [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]
        + [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]
        + [ctypes.c_void_p] + [ctypes.c_int64] * 4 + [ctypes.c_int, ctypes.c_int, ctypes.c_float, ctypes.c_int]
    )
    lib.has_float16.restype = ctypes.c_int
    lib.uses_openmp.restype = ctypes.c_int
    lib.runtime_max_threads.restype = ctypes.c_int
    return lib, None


def _shares_torch_runtime(lib: ctypes.CDLL) -> bool:
    """Whether the ``-fopenmp`` build runs on PyTorch's own OpenMP runtime: ``torch.set_num_threads(k)``
    (which sets the runtime's thread count) must change what the library's runtime reports. A second
    runtime (e.g. a system ``libgomp.so.1`` loaded by another package while torch runs on a renamed
    copy) would not follow."""
    before = torch.get_num_threads()
    try:
        seen = []
        for k in (before + 1, max(1, before)):
            torch.set_num_threads(k)
            seen.append(lib.runtime_max_threads() == k)
        return all(seen)
    finally:
        torch.set_num_threads(before)


def _compiler_version() -> tuple:
    """``(compiler path, its --version text)``, or ``(None, why not)``."""
    cc = _compiler()
    if cc is None:
        return None, "no C compiler found (cc, gcc, clang or $CC)"
    try:
        return cc, subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as err:
        return None, f"the C compiler {cc} did not run: {err}"


_own: Optional[tuple] = None  # (library or None, why not), once tried


def _own_threads_library() -> Optional[ctypes.CDLL]:
    """The kernel built without ``-fopenmp`` (a thread of its own started per call beside the calling
    thread, with two threads), or ``None``; built once (a failure is remembered too)."""
    global _own
    with _lock:
        if _own is None:
            cc, version = _compiler_version()
            if cc is None:
                _own = (None, version)
            elif sys.byteorder != "little":
                _own = (None, "big-endian machine")
            else:
                _own = _build(cc, version, _FLAGS)
        return _own[0]


def fused_rope_own_threads(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> torch.Tensor:
    """The forward pass of :func:`fused_rope` computed by the same C loop built without OpenMP,
    on threads of its own started for each call: the same bits, for timing the two arrangements
    side by side (appendix notebook 02a §3, ``benchmarks/rope_bench.py``). No gradient. Raises
    ``ValueError`` where :func:`can_use` is false or no compiler is available."""
    if layout not in ("interleaved", "half"):
        raise ValueError(f"layout must be 'interleaved' or 'half', got {layout!r}")
    if not can_use(x, cos, sin):
        raise ValueError(f"the fused kernel does not apply here ({status(x.dtype)}; x {tuple(x.shape)} {x.dtype})")
    lib = _own_threads_library()
    if lib is None:
        raise ValueError("the kernel without OpenMP could not be built here")
    return _launch(x.detach(), cos, sin, layout == "half", 1.0, lib=lib)


def _load() -> Optional[ctypes.CDLL]:
    global _lib, _reason, _tried, _threading
    with _lock:
        if _tried:
            return _lib
        _tried = True
        if sys.byteorder != "little":
            _reason = "big-endian machine (the kernel reads a bfloat16 pair as one little-endian word)"
            return None
        cc, version = _compiler_version()
        if cc is None:
            _reason = version
            return None
        # with -fopenmp first where it binds to PyTorch's own OpenMP runtime, else (or if that
        # build fails) threads of the kernel's own
        variants = ([_FLAGS + ["-fopenmp"]] if _torch_libgomp() and _is_gcc(version) else []) + [_FLAGS]
        why_not_openmp = "" if len(variants) > 1 else "; GCC with PyTorch on GNU OpenMP would use PyTorch's pool"
        for flags in variants:
            lib, _reason = _build(cc, version, flags)
            if lib is not None and lib.uses_openmp() and not _shares_torch_runtime(lib):
                lib, _reason = None, "the -fopenmp build did not share PyTorch's OpenMP runtime"
            if lib is None and "-fopenmp" in flags:
                why_not_openmp = f" ({_reason})"
            if lib is not None:
                break
        if lib is None:
            return None
        _threading = "OpenMP (PyTorch's runtime)" if lib.uses_openmp() else "threads of its own" + why_not_openmp
        _lib = lib
        return lib


def _env_disabled() -> bool:
    return os.environ.get("HELPERS_FUSED_ROPE", "1").strip().lower() in ("0", "false", "no", "off")


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Within this block :func:`helpers.apply_rope` uses PyTorch operators only (to compare
    the two paths, or to time the fallback)."""
    token = _disabled_depth.set(_disabled_depth.get() + 1)
    try:
        yield
    finally:
        _disabled_depth.reset(token)


def status(dtype: torch.dtype = torch.bfloat16) -> str:
    """One line: is the fused kernel used for CPU tensors of ``dtype``, and if not, why."""
    if dtype not in (torch.bfloat16, torch.float16):
        return f"not used for {dtype}: the kernel is for float16/bfloat16 (float32 takes one complex multiply)"
    if _env_disabled():
        return "not used: HELPERS_FUSED_ROPE=0"
    if _disabled_depth.get():
        return "not used: inside helpers.rope_kernel.disabled()"
    lib = _load()
    if lib is None:
        return f"not used: {_reason}"
    if dtype == torch.float16 and not lib.has_float16():
        return "not used for float16: this C compiler has no _Float16 type"
    return (f"used for {str(dtype).replace('torch.', '')} CPU tensors (C kernel compiled with "
            f"{Path(_compiler() or 'cc').name}; parallel on {_threading})")


def _dual_level_active() -> bool:
    """Whether a forward-mode AD level is open (``with torch.autograd.forward_ad.dual_level()``):
    outside one no tensor carries a tangent, and the checks below are skipped."""
    # -1 when the private attribute is missing (a renamed one must not read as "a level is open")
    return getattr(torch.autograd.forward_ad, "_current_level", -1) >= 0


def _has_tangent(t: torch.Tensor) -> bool:
    """Whether ``t`` carries a forward-mode AD tangent (``torch.autograd.forward_ad``)."""
    try:
        return torch.autograd.forward_ad.unpack_dual(t).tangent is not None
    except RuntimeError:
        return False


_IS_WRAPPED = getattr(getattr(torch._C, "_functorch", None), "is_functorch_wrapped_tensor", None)


def _is_wrapped(t: torch.Tensor) -> bool:
    return bool(_IS_WRAPPED(t)) if _IS_WRAPPED is not None else False


def can_use(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """Whether :func:`fused_rope` applies to these tensors (see the module docstring)."""
    if _disabled_depth.get() or _env_disabled():
        return False
    if x.is_neg() or x.is_conj():
        return False  # a lazy negation (or conjugation) bit: data_ptr() holds the un-negated values
    if type(x) is not torch.Tensor or type(cos) is not torch.Tensor or type(sin) is not torch.Tensor:
        return False  # tensor subclasses (FakeTensor, ...) have no memory to hand to C
    if any(_is_wrapped(t) for t in (x, cos, sin)):
        return False  # vmap / torch.func transforms: their wrappers have no memory either
    if x.dtype not in (torch.bfloat16, torch.float16) or x.device.type != "cpu" or not 2 <= x.dim() <= 4:
        return False
    if x.shape[-1] % 2 or x.numel() == 0 or x.stride(-1) != 1:
        return False
    if cos.dtype != torch.float32 or sin.dtype != torch.float32 or cos.shape != sin.shape:
        return False
    if cos.requires_grad or sin.requires_grad or cos.device.type != "cpu" or sin.device.type != "cpu":
        return False
    if _dual_level_active() and (_has_tangent(cos) or _has_tangent(sin)):
        return False  # forward-mode AD through the angles (learned frequencies): the fallback differentiates them
    want = tuple(x.shape[:-1]) + (x.shape[-1] // 2,)
    have = tuple(cos.shape)
    if len(have) > len(want) or have[-1:] != want[-1:] or any(h not in (1, w) for h, w in zip(have[::-1], want[::-1])):
        return False  # cos/sin must broadcast to (..., seq, d/2), one value per pair (the C loop reads d/2 of them)
    lib = _lib if _lib is not None else _load()
    if lib is None or (x.dtype == torch.float16 and not _has_f16(lib)):
        return False
    return True


_F16: Optional[bool] = None


def _has_f16(lib) -> bool:
    global _F16
    if _F16 is None:
        _F16 = bool(lib.has_float16())
    return _F16


def _strides4(t: torch.Tensor) -> tuple:
    """The first three strides of ``t`` viewed as 4-d (right-aligned, missing leading dimensions
    added in front); a dimension of size 1 gets stride 0, so it broadcasts (a table of size 1
    there is read again for every row, as ``expand`` would)."""
    st = [0, 0, 0, 0][: 4 - t.dim()] + [0 if n == 1 else s for n, s in zip(t.shape, t.stride())]
    return st[0], st[1], st[2]


def _launch(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, half: bool, sign: float,
            lib: Optional[ctypes.CDLL] = None) -> torch.Tensor:
    lib = lib or (_lib if _lib is not None else _load())
    assert lib is not None
    if sign < 0:
        sin = -sin  # the inverse rotation R^T: angle -phi (a table, far smaller than x)
    d = x.shape[-1]
    shape4 = (1,) * (4 - x.dim()) + tuple(x.shape)
    # one table layout for both (each row's d/2 values adjacent; broadcast dimensions stride 0)
    if cos.stride(-1) != 1:
        cos = cos.contiguous()
    if sin.stride(-1) != 1:
        sin = sin.contiguous()
    cst = _strides4(cos)
    if _strides4(sin) != cst:
        cos, sin = cos.contiguous(), sin.contiguous()
        cst = _strides4(cos)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    threads = max(1, min(torch.get_num_threads(), x.numel() // _MIN_ELEMENTS_PER_THREAD))
    xs0, xs1, xs2 = _strides4(x)
    lib.rope_lowp(
        x.data_ptr(), xs0, xs1, xs2,
        cos.data_ptr(), sin.data_ptr(), cst[0], cst[1], cst[2],
        out.data_ptr(), shape4[0], shape4[1], shape4[2], d,
        int(half), int(x.dtype == torch.float16), float(sign), threads,
    )
    return out


class _FusedRope(torch.autograd.Function):
    """Forward: rotate by the angles; backward: rotate the incoming gradient back (R^T = R^{-1})."""

    @staticmethod
    def forward(ctx, x, cos, sin, half: bool):  # type: ignore[override]
        ctx.save_for_backward(cos, sin)
        ctx.save_for_forward(cos, sin)
        ctx.half = half
        return _launch(x, cos, sin, half, 1.0)

    @staticmethod
    def jvp(ctx, x_tangent, cos_tangent, sin_tangent, half_tangent):  # type: ignore[override]
        # forward-mode AD: the rotation is linear in x, so the tangent is rotated the same way
        cos, sin = ctx.saved_tensors
        if x_tangent.stride(-1) != 1:
            x_tangent = x_tangent.contiguous()
        return _launch(x_tangent, cos, sin, ctx.half, 1.0)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        # R^T grad = rotation by -phi, itself a _FusedRope: so the backward is differentiable too
        # (second derivatives, e.g. a gradient penalty, work as on the operator path)
        cos, sin = ctx.saved_tensors
        if grad.stride(-1) != 1:
            grad = grad.contiguous()
        return _FusedRope.apply(grad, cos, -sin, ctx.half), None, None, None


def fused_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> torch.Tensor:
    r"""RoPE of float16/bfloat16 ``x`` (``(..., seq, d)``, 2 to 4 dimensions) with float32
    ``cos``/``sin`` broadcastable to ``(..., seq, d/2)``, in one pass (see the module docstring);
    ``layout`` ``"interleaved"`` (pairs ``2i, 2i+1``) or ``"half"`` (pairs ``i, i+d/2``).
    Differentiable in ``x``. Raises ``ValueError`` when :func:`can_use` is false."""
    if layout not in ("interleaved", "half"):
        raise ValueError(f"layout must be 'interleaved' or 'half', got {layout!r}")
    if not can_use(x, cos, sin):
        raise ValueError(f"the fused kernel does not apply here ({status(x.dtype)}; x {tuple(x.shape)} {x.dtype} on "
                         f"{x.device}, cos {tuple(cos.shape)} {cos.dtype}); call helpers.apply_rope, which falls back")
    return _apply(x, cos, sin, layout == "half")


def _apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, half: bool) -> torch.Tensor:
    """:func:`fused_rope` once :func:`can_use` has said yes: through the autograd Function only
    where a derivative can be asked for (``x`` needs a gradient with grad mode on, or a
    forward-AD level is open); otherwise the kernel alone (no graph node to build)."""
    if (x.requires_grad and torch.is_grad_enabled()) or _dual_level_active():
        return _FusedRope.apply(x, cos, sin, half)
    return _launch(x, cos, sin, half, 1.0)


def try_fused(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> Optional[torch.Tensor]:
    """:func:`fused_rope` where :func:`can_use` allows it, else ``None`` (one check, for
    :func:`helpers.apply_rope`)."""
    if not can_use(x, cos, sin):
        return None
    return _apply(x, cos, sin, layout == "half")
