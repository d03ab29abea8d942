r"""A fused RoPE kernel for float16/bfloat16 CPU tensors: one pass over memory. Opt-in.

A measuring instrument for appendix notebook 02a §3 and ``benchmarks/rope_bench.py``:
:func:`helpers.apply_rope` never calls it (it rotates float16/bfloat16 with PyTorch operators,
in float32, rounded once). Call it explicitly::

    from helpers.lab.rope_kernel import fused_apply_rope, status
    print(status())                      # can it be built and loaded here, and how it threads
    y = fused_apply_rope(x_bf16)         # apply_rope(x_bf16) within one rounding step, in one pass

Why it exists. In eager PyTorch every element-wise operator is one pass over memory, and on the
CPU each bfloat16 operator widens every element to float32 and rounds it back. So rotating
bfloat16 by operators with one rounding needs float32 temporaries twice the size of ``x``:
6.5-10x the time of ``x.clone()`` (interleaved) and 9-15x (half layout) in ``rope_bench.py``'s runs
of 2026-12-02 (a 2-core AVX-512 machine shared with other jobs, so under load:
``benchmarks/results/rope_bench_2026-12-02.txt``). This kernel, a short C loop (about two hundred
lines with AVX2 vector code) compiled once per machine by the system's C compiler, reads each
pair once, widens it, rotates it with float32 ``cos``/``sin``, rounds once (to nearest even, as
``Tensor.to`` does) and writes it once: 1.8-2.7x ``x.clone()`` in those runs, and 1.0-1.6x in the
idle runs of 2026-12-01 on a 2-core AVX2 machine with 32 MiB of L3, where the benchmark's clone
read ``x`` from main memory (``rope_bench_2026-12-01.md``).

.. math::
    y_a = \mathrm{rd}(x_a\cos\phi - x_b\sin\phi), \qquad
    y_b = \mathrm{rd}(x_b\cos\phi + x_a\sin\phi)

Each product and sum is a float32 operation without fused multiply-add (``-ffp-contract=off``),
so the kernel equals step-by-step float32 arithmetic bit for bit (``tests/test_rope_kernel.py``).
``apply_rope``'s interleaved path gives the same bits. Where ``addcmul_`` is a fused multiply-add
(PyTorch's AVX2 and AVX-512 kernels), its half layout adds the sine term with one rounding fewer:
about one output in 10^4 (float16; a few in 10^5 in bfloat16) differs, by one rounding step or,
near a cancellation, by up to 2^-22 (|x_a| + |x_b|) more (appendix 02a §3 asserts that bound).
The backward pass is the inverse rotation (:math:`R^\top = R_{-m}`), by the same kernel.

Where it runs. Linux and macOS with ``cc``, ``gcc`` or ``clang`` (or ``$CC``), little-endian,
CPU tensors of 2 to 4 dimensions whose last dimension is contiguous. Not on Windows (it needs a
POSIX compiler and ``pthread``). It sits outside PyTorch's dispatcher (``ctypes`` on the
tensors' memory), so ``torch.compile``, ``vmap`` and tensor subclasses are refused, not served.
:func:`status` says whether it can be built and loaded here; a tensor it cannot rotate (another
device, a ``torch.func`` transform, a subclass) makes :func:`fused_apply_rope` raise ``ValueError``
saying why.

The compiled library is kept in the user's cache folder (:func:`cache_folder`, e.g.
``~/.cache/attention-notebooks``), created private (mode 0o700). A library is built under a
temporary name in that folder and renamed into place (``os.replace``), so another process sees
the whole file or none; before loading, the folder and the file must belong to this user and be
writable by nobody else, else the library is refused and named in the error. On Linux the file
is opened once and loaded through that open file (``/proc/self/fd``), so the file checked is the
file loaded.

Threads. Where PyTorch runs on GNU OpenMP (``libgomp.so.1``, Linux wheels) and the compiler is
GCC, the loop is built with ``-fopenmp`` and runs on PyTorch's own thread pool: the loader binds
it to the ``libgomp.so.1`` torch already loaded, which is checked by comparing the address of
``omp_get_max_threads`` in both (nothing is changed to check it). A thread of its own per call
shared the two cores with PyTorch's spinning workers and took 2.7-3.1x ``x.clone()`` instead of
1.0-1.6x (on the AVX2 machine; on the AVX-512 one the two took about the same time). Elsewhere
(clang, macOS, another runtime) it starts threads of its own. As with PyTorch's own operators on
OpenMP, a forked child must call ``torch.set_num_threads(1)`` before using it
(:func:`helpers.lab.sweep` does); with one thread the kernel opens no parallel region.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Optional

import torch

from ..rope import LAYOUTS, PositionsLike, rope_cos_sin
from ..validate import check_choice

__all__ = ["fused_apply_rope", "status", "cache_folder", "KernelUnavailable"]


class KernelUnavailable(RuntimeError):
    """The kernel cannot be built or loaded here; the message says why."""

_SOURCE = r"""
#include <stdint.h>
#include <string.h>
#include <pthread.h>
#ifdef _OPENMP
#include <omp.h>
int uses_openmp(void) { return 1; }
/* the thread count the kernel's OpenMP runtime would use (follows torch.set_num_threads on PyTorch's own runtime) */
int runtime_max_threads(void) { return omp_get_max_threads(); }
/* the omp_get_max_threads this library bound to: PyTorch's own runtime if it is the same function */
void *omp_entry(void) { return (void *)&omp_get_max_threads; }
#else
int uses_openmp(void) { return 0; }
int runtime_max_threads(void) { return -1; }
void *omp_entry(void) { return 0; }
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
# exactly as PyTorch's element-wise multiply and add round them.
_MIN_ELEMENTS_PER_THREAD = 1 << 16
_lock = threading.Lock()
_built: dict[str, tuple] = {}  # "pool" / "own threads" -> (library or None, why not, how it threads)


def cache_folder() -> Path:
    """The folder the compiled kernel is kept in: ``attention-notebooks`` in the user's cache
    folder (``platformdirs.user_cache_dir``: ``$XDG_CACHE_HOME`` or ``~/.cache`` on Linux,
    ``~/Library/Caches`` on macOS)."""
    import platformdirs

    return Path(platformdirs.user_cache_dir("attention-notebooks", appauthor=False))


def _check_private(st: os.stat_result, path: Path, what: str) -> None:
    """Refuse ``path`` unless it belongs to this user and nobody else can write it: a library that
    another user could put or change there would run inside this process."""
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise KernelUnavailable(
            f"refusing {what} {path}: owner uid {st.st_uid} (this user is {os.getuid()}), mode "
            f"{stat.S_IMODE(st.st_mode):#o}; it must belong to this user and be writable by no one else")


def _private_folder() -> Path:
    """:func:`cache_folder`, created with mode 0o700, checked: a real folder of this user's, writable by no one else."""
    folder = cache_folder()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode):
        raise KernelUnavailable(f"refusing the cache folder {folder}: not a folder (a symbolic link?)")
    _check_private(st, folder, "the cache folder")
    return folder


def _open_checked(so: Path) -> ctypes.CDLL:
    """Load the library ``so`` after checking its owner and mode on the open file itself; on Linux
    the library is loaded through that open file, so a file swapped in after the check is not loaded.

    The file stays open for the library's life (``lib._checked_fd``): glibc's ``dlopen`` returns an
    already-loaded object of the same name, so a second library loaded through a reused descriptor
    number ``/proc/self/fd/N`` would get the first one's handle."""
    try:
        fd = os.open(so, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))  # a symbolic link is refused
    except OSError as err:
        raise KernelUnavailable(f"refusing the library {so}: {err}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise KernelUnavailable(f"refusing the library {so}: not a regular file")
        _check_private(st, so, "the library")
        via_fd = Path(f"/proc/self/fd/{fd}")
        try:
            lib = ctypes.CDLL(str(via_fd) if via_fd.exists() else str(so))
        except OSError as err:
            raise KernelUnavailable(f"loading the compiled kernel {so} failed: {err}") from None
    except BaseException:
        os.close(fd)
        raise
    lib._checked_fd = fd
    return lib


def _compiler() -> tuple[str, str]:
    """``(compiler path, its --version text)``."""
    cc = next((shutil.which(c) for c in (os.environ.get("CC"), "cc", "gcc", "clang") if c and shutil.which(c)), None)
    if cc is None:
        raise KernelUnavailable("no C compiler found (cc, gcc, clang or $CC)")
    try:
        return cc, subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as err:
        raise KernelUnavailable(f"the C compiler {cc} did not run: {err}") from None


def _cpu_fingerprint() -> str:
    """What the binary's ``-march=native`` depends on: the CPU's feature flags (a home folder
    shared by machines with different CPUs must not reuse another CPU's binary)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
        flags = next((line for line in text.splitlines() if line.startswith(("flags", "Features"))), "")
    except OSError:
        flags = ""
    return flags + platform.machine() + platform.processor()


def _build(cc: str, version: str, flags: list) -> ctypes.CDLL:
    """The library compiled with ``flags``, from the cache when it is there (its file name is a hash of
    everything the binary depends on), else compiled under a temporary name and renamed into place."""
    key = hashlib.sha256("\0".join([_SOURCE, " ".join(flags), cc, version, _cpu_fingerprint()]).encode()).hexdigest()[:16]
    folder = _private_folder()
    so = folder / f"rope_lowp_{key}.so"
    if not os.path.lexists(so):
        fd, tmp = tempfile.mkstemp(prefix=f".rope_lowp_{key}.", suffix=".so.tmp", dir=folder)
        os.close(fd)
        src = Path(tmp).with_suffix(".c")
        try:
            src.write_text(_SOURCE)
            proc = subprocess.run([cc, *flags, str(src), "-o", tmp], capture_output=True, text=True, timeout=120)
            if proc.returncode != 0:
                raise KernelUnavailable(f"compiling the kernel with {cc} failed: {proc.stderr.strip()[:300]}")
            os.chmod(tmp, 0o700)  # a linker writing a new file takes the umask's mode; the check wants no group/other write
            os.replace(tmp, so)  # atomic: another process sees the whole library or none
        except (OSError, subprocess.SubprocessError) as err:
            raise KernelUnavailable(f"compiling the kernel failed: {err}") from None
        finally:
            for leftover in (Path(tmp), src):
                leftover.unlink(missing_ok=True)
    lib = _open_checked(so)
    lib.rope_lowp.restype = ctypes.c_int
    lib.rope_lowp.argtypes = (
        [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]
        + [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]
        + [ctypes.c_void_p] + [ctypes.c_int64] * 4 + [ctypes.c_int, ctypes.c_int, ctypes.c_float, ctypes.c_int]
    )
    for name in ("has_float16", "uses_openmp", "runtime_max_threads"):
        getattr(lib, name).restype = ctypes.c_int
    lib.omp_entry.restype = ctypes.c_void_p
    return lib


def _torch_libgomp() -> Optional[str]:
    """The path of GNU OpenMP (``libgomp.so.1``) if PyTorch runs its operators on it in this process: a library
    built with ``-fopenmp`` (which asks for ``libgomp.so.1``) then binds to that same runtime."""
    if "parallel backend: OpenMP" not in torch.__config__.parallel_info():
        return None
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None  # not Linux: threads of our own
    return next((line.split()[-1] for line in maps.splitlines() if line.rstrip().endswith("/libgomp.so.1")), None)


def _is_gcc(version: str) -> bool:
    """Whether ``cc --version`` names GCC (whose ``-fopenmp`` links ``libgomp.so.1``; clang's links
    its own ``libomp``, a second runtime)."""
    first = version.splitlines()[0].lower() if version.strip() else ""
    return "clang" not in version.lower() and ("gcc" in first or first.startswith("cc ")) and "Free Software Foundation" in version


def _shares_torch_runtime(lib: ctypes.CDLL) -> bool:
    """Whether the ``-fopenmp`` build runs on PyTorch's own OpenMP runtime: its ``omp_get_max_threads``
    is the one in the ``libgomp.so.1`` torch loaded (compared by address; no thread count is changed)."""
    path = _torch_libgomp()
    if path is None:
        return False
    torch_entry = ctypes.cast(ctypes.CDLL(path).omp_get_max_threads, ctypes.c_void_p).value
    return bool(lib.omp_entry()) and lib.omp_entry() == torch_entry


def _library(own_threads: bool = False) -> tuple[ctypes.CDLL, str]:
    """``(the kernel, what it was built with)``, built (or found in the cache) and loaded once per
    process; raises :class:`KernelUnavailable` with the reason (remembered: it is not retried)."""
    which = "own threads" if own_threads else "pool"
    with _lock:
        if which not in _built:
            try:
                _built[which] = _load(own_threads)
            except KernelUnavailable as err:
                _built[which] = (None, str(err))
        lib, text = _built[which]
    if lib is None:
        raise KernelUnavailable(text)
    return lib, text


def _load(own_threads: bool) -> tuple[ctypes.CDLL, str]:
    if sys.platform.startswith(("win", "cygwin")):
        raise KernelUnavailable("not on Windows: the kernel is built by a POSIX C compiler with pthread; "
                                "helpers.apply_rope gives the same rotation with PyTorch operators")
    if sys.byteorder != "little":
        raise KernelUnavailable("big-endian machine (the kernel reads a bfloat16 pair as one little-endian word)")
    cc, version = _compiler()
    built = f"C kernel compiled with {Path(cc).name}; parallel on "
    if own_threads:
        return _build(cc, version, _FLAGS), built + "threads of its own"
    why = "GCC with PyTorch on GNU OpenMP would use PyTorch's pool"
    if _torch_libgomp() and _is_gcc(version):  # first the -fopenmp build, on PyTorch's own pool
        try:
            lib = _build(cc, version, _FLAGS + ["-fopenmp"])
            if _shares_torch_runtime(lib):
                return lib, built + "OpenMP (PyTorch's runtime)"
            why = "the -fopenmp build did not share PyTorch's OpenMP runtime"
        except KernelUnavailable as err:
            why = str(err)
    return _build(cc, version, _FLAGS), built + f"threads of its own ({why})"


def status(dtype: torch.dtype = torch.bfloat16) -> str:
    """One line: can :func:`fused_apply_rope` run for CPU tensors of ``dtype`` here, and on which threads.
    Builds (or finds in the cache) and loads the kernel on its first call."""
    if dtype not in (torch.bfloat16, torch.float16):
        return f"not for {dtype}: the kernel is for float16/bfloat16 (float32 takes one complex multiply)"
    try:
        lib, built = _library()
    except KernelUnavailable as err:
        return f"not available: {err}"
    if dtype == torch.float16 and not lib.has_float16():
        return "not available for float16: this C compiler has no _Float16 type"
    return f"available for {str(dtype).replace('torch.', '')} CPU tensors ({built})"


def _dual_level_active() -> bool:
    """Whether a forward-mode AD level is open (``with torch.autograd.forward_ad.dual_level()``)."""
    return getattr(torch.autograd.forward_ad, "_current_level", -1) >= 0  # -1: a renamed attribute is not "open"


def _has_tangent(t: torch.Tensor) -> bool:
    try:
        return torch.autograd.forward_ad.unpack_dual(t).tangent is not None
    except RuntimeError:
        return False


_IS_WRAPPED = getattr(getattr(torch._C, "_functorch", None), "is_functorch_wrapped_tensor", None)


def _why_not(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> Optional[str]:
    """Why the kernel cannot rotate these tensors (``None``: it can)."""
    if type(x) is not torch.Tensor or (_IS_WRAPPED is not None and _IS_WRAPPED(x)):
        return "a tensor subclass or a torch.func transform (vmap, grad): their tensors have no memory to hand to C"
    if x.is_neg() or x.is_conj():
        return "a lazily negated or conjugated tensor (its memory holds the other values)"
    if x.dtype not in (torch.bfloat16, torch.float16):
        return f"x is {x.dtype}: the kernel is for float16/bfloat16"
    if x.device.type != "cpu" or not 2 <= x.dim() <= 4 or x.stride(-1) != 1 or x.numel() == 0:
        return "x must be a non-empty CPU tensor of 2 to 4 dimensions with a contiguous last dimension"
    if cos.requires_grad or sin.requires_grad or (_dual_level_active() and (_has_tangent(cos) or _has_tangent(sin))):
        return "the angles need a gradient (learned frequencies): only x is differentiated by the kernel"
    return None


def _strides4(t: torch.Tensor) -> tuple:
    """The first three strides of ``t`` viewed as 4-d (right-aligned, missing leading dimensions
    added in front); a dimension of size 1 gets stride 0, so it broadcasts."""
    st = [0, 0, 0, 0][: 4 - t.dim()] + [0 if n == 1 else s for n, s in zip(t.shape, t.stride())]
    return st[0], st[1], st[2]


def _launch(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, half: bool, lib: ctypes.CDLL) -> torch.Tensor:
    """The C loop on ``x`` (``(..., seq, d)``, 2 to 4 dimensions) with float32 tables broadcastable to
    ``(..., seq, d/2)``, one value per pair, each table row contiguous."""
    if cos.stride(-1) != 1 or sin.stride(-1) != 1 or _strides4(sin) != _strides4(cos):
        cos, sin = cos.contiguous(), sin.contiguous()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    shape4 = (1,) * (4 - x.dim()) + tuple(x.shape)
    threads = max(1, min(torch.get_num_threads(), x.numel() // _MIN_ELEMENTS_PER_THREAD))
    (xs0, xs1, xs2), cst = _strides4(x), _strides4(cos)
    lib.rope_lowp(x.data_ptr(), xs0, xs1, xs2, cos.data_ptr(), sin.data_ptr(), cst[0], cst[1], cst[2],
                  out.data_ptr(), shape4[0], shape4[1], shape4[2], x.shape[-1],
                  int(half), int(x.dtype == torch.float16), 1.0, threads)
    return out


class _FusedRope(torch.autograd.Function):
    """Forward: rotate by the angles; backward: rotate the incoming gradient back (R^T = R^{-1})."""

    @staticmethod
    def forward(ctx, x, cos, sin, half: bool):  # type: ignore[override]
        ctx.save_for_backward(cos, sin)
        ctx.save_for_forward(cos, sin)
        ctx.half = half
        return _launch(x, cos, sin, half, _library()[0])

    @staticmethod
    def jvp(ctx, x_tangent, cos_tangent, sin_tangent, half_tangent):  # type: ignore[override]
        cos, sin = ctx.saved_tensors  # the rotation is linear in x: the tangent is rotated the same way
        return _launch(x_tangent if x_tangent.stride(-1) == 1 else x_tangent.contiguous(), cos, sin, ctx.half, _library()[0])

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        cos, sin = ctx.saved_tensors  # R^T grad: the rotation by -phi, itself a _FusedRope (second derivatives work)
        return _FusedRope.apply(grad if grad.stride(-1) == 1 else grad.contiguous(), cos, -sin, ctx.half), None, None, None


def fused_apply_rope(
    x: torch.Tensor, positions: PositionsLike = None, base: float = 10000.0, layout: str = "interleaved",
    *, own_threads: bool = False,
) -> torch.Tensor:
    """:func:`helpers.apply_rope` of float16/bfloat16 CPU ``x`` by the fused kernel: the same
    arguments (``positions`` of every shape it takes, ``base``, ``layout``) and the same angles;
    float32 arithmetic, one rounding, one pass. Differentiable in ``x`` (backward and forward mode).

    ``own_threads=True`` runs the same C loop built without OpenMP, on threads of its own started
    for each call (forward only, for timing the two arrangements side by side).

    Raises :class:`KernelUnavailable` where the kernel cannot be built or loaded (:func:`status`
    says why) and ``ValueError`` for tensors it cannot rotate (the message says why).
    """
    cos, sin = rope_cos_sin(x, positions, base)  # checks x, head_dim and base; the angles of apply_rope
    check_choice(layout, "layout", LAYOUTS)
    why = _why_not(x, cos, sin)
    if why is not None:
        raise ValueError(f"the fused kernel does not apply here: {why}; helpers.apply_rope rotates it with operators")
    lib, _ = _library(own_threads)
    if x.dtype == torch.float16 and not lib.has_float16():
        raise KernelUnavailable("this C compiler has no _Float16 type: no float16 kernel")
    if own_threads:
        return _launch(x.detach(), cos, sin, layout == "half", lib)
    if (x.requires_grad and torch.is_grad_enabled()) or _dual_level_active():
        return _FusedRope.apply(x, cos, sin, layout == "half")  # a graph node only where a derivative can be asked for
    return _launch(x, cos, sin, layout == "half", lib)
