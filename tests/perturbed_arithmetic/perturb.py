"""Perturbed arithmetic: torch's order-dependent results moved by one unit in the last place.

A learner's CPU sums in another order than the machine that produced the committed notebook
outputs (another SIMD width, another BLAS blocking, another thread split), so every matrix
product, sum, norm, softmax, normalisation, attention kernel and linalg routine can come out
one or a few ulps away, and every training trajectory moves with it. Nobody here owns that
CPU; this module imitates it.

:class:`PerturbedArithmetic` is a ``TorchDispatchMode``: it sees every ATen kernel below
autograd (backward passes included, fast paths kept) and, for the operations listed in
:data:`ORDER_DEPENDENT` (plus the vectorised transcendental functions, whose last bit differs
between SIMD implementations), moves each floating-point result by exactly one ulp, up or down
(its last significand bit flipped). The direction is a function of the result's own bits, so the
perturbation is deterministic: equal inputs still give equal outputs, as on a real CPU, and a notebook run
twice under it prints the same thing twice.

Left unchanged, because they are the same on every CPU by construction:

* zeros, infinities and NaNs (a masked softmax weight is exactly 0 everywhere; a NaN whose
  payload is exactly 1 would become an infinity, which torch never produces);
* results whose last :data:`EXACT_LOW_BITS` mantissa bits are all zero: integers, counts,
  halves, quarters, accuracies such as 255/256. A sum of such numbers is exact in any order.
  (A genuine round-off result has such a pattern with probability 2^-8 in float32/64.)
* a sum or mean of one term and a matrix product with an inner dimension of 1 (exact everywhere);
* everything else: element-wise ``+ - * /``, ``sqrt``, comparisons, indexing, copies, ``max``
  and ``argmax``, which IEEE 754 rounds correctly whatever the hardware.

Used by the perturbed-arithmetic pass (CONTRIBUTING.md): the IPython startup file beside this
module enters the mode in every kernel that nbval starts when ``IPYTHONDIR`` points at
``tests/perturbed_arithmetic/ipython``. ``tests/test_perturbed_arithmetic.py`` tests the mode.
"""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["ORDER_DEPENDENT", "TRANSCENDENTAL", "EXACT_LOW_BITS", "perturb", "PerturbedArithmetic", "counts"]

aten = torch.ops.aten

# ATen overload packets whose floating-point result depends on the order of a reduction.
ORDER_DEPENDENT = {
    # matrix products (matmul, linear, einsum, @ decompose into these)
    "mm", "bmm", "addmm", "addmv", "mv", "dot", "vdot", "baddbmm", "addbmm", "addr", "_addmm_activation",
    "convolution", "convolution_backward", "_int_mm",
    # reductions
    "sum", "nansum", "mean", "nanmean", "prod", "cumsum", "cumprod", "logsumexp", "logcumsumexp",
    "var", "std", "var_mean", "std_mean", "norm", "linalg_vector_norm", "linalg_matrix_norm", "_euclidean_dist",
    "cdist", "_cdist_forward", "trace", "dist",
    # softmax, normalisation, losses
    "_softmax", "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data",
    "native_layer_norm", "native_layer_norm_backward", "_fused_rms_norm", "native_group_norm",
    "native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
    "native_batch_norm_backward", "nll_loss_forward", "nll_loss_backward", "nll_loss2d_forward",
    "mse_loss", "binary_cross_entropy", "binary_cross_entropy_with_logits", "kl_div", "smooth_l1_loss",
    "embedding_dense_backward", "index_add", "scatter_add", "scatter_reduce", "index_reduce", "_embedding_bag",
    # attention kernels
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_fused_attention_overrideable",
    "_native_multi_head_attention", "_transformer_encoder_layer_fwd", "_masked_softmax",
    # linear algebra
    "linalg_det", "_linalg_det", "det", "linalg_slogdet", "_linalg_slogdet", "logdet", "_linalg_svd",
    "linalg_svd", "svd", "_linalg_eigh", "linalg_eigh", "linalg_eig", "linalg_eigvals", "linalg_eigvalsh",
    "linalg_solve", "_linalg_solve_ex", "linalg_solve_ex", "linalg_inv_ex", "linalg_inv", "inverse",
    "linalg_qr", "linalg_cholesky_ex", "cholesky", "linalg_lstsq", "linalg_lu_factor_ex", "linalg_lu",
    "linalg_lu_solve", "triangular_solve", "linalg_solve_triangular", "linalg_pinv", "linalg_matrix_exp",
    "cholesky_solve", "ormqr", "geqrf", "_fft_r2c", "_fft_c2r", "_fft_c2c",
}

# Element-wise functions that IEEE 754 does not require to be correctly rounded: torch's vectorised
# (SLEEF) and scalar implementations differ in the last bit, so they differ between SIMD levels.
TRANSCENDENTAL = {
    "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan", "asin", "acos", "atan",
    "atan2", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "sigmoid", "erf", "erfc", "erfinv",
    "gelu", "gelu_backward", "silu", "silu_backward", "softplus", "tanh_backward", "sigmoid_backward",
    "pow", "polar", "lgamma", "digamma", "logit", "xlogy", "special_xlog1py",
}

PERTURBED = ORDER_DEPENDENT | TRANSCENDENTAL

# A result whose lowest EXACT_LOW_BITS mantissa bits are all zero is taken to be exact (see above).
EXACT_LOW_BITS = {torch.float64: 8, torch.float32: 8, torch.float16: 2, torch.bfloat16: 2}
_INT_VIEW = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16,
             torch.bfloat16: torch.int16}

counts: dict[str, int] = {}  # op name -> number of results perturbed (for the tests)


def perturb(t: torch.Tensor) -> torch.Tensor:
    """``t`` with every inexact entry moved by one ulp (a new tensor; ``t`` unchanged).

    The move flips the last bit of the significand: up by one ulp where it is 0, down where it is 1,
    so the direction is a function of the value and equal entries move alike; it never leaves the
    binade, so it is exactly one ulp. Entries whose last :data:`EXACT_LOW_BITS` significand bits are
    all zero stay: zeros, infinities, canonical NaNs, integers, halves (see the module docstring).
    Complex tensors move their real and imaginary parts; other dtypes come back as they are.
    Four element-wise kernels per call: the pass runs every notebook, so it has to be cheap.
    """
    if t.is_complex():
        return torch.view_as_complex(perturb(torch.view_as_real(t).contiguous()))
    if t.dtype not in _INT_VIEW or t.numel() == 0 or t.device.type == "meta":
        return t
    bits = t.view(_INT_VIEW[t.dtype])                       # same strides as t: a reinterpretation, no copy
    inexact = (bits & ((1 << EXACT_LOW_BITS[t.dtype]) - 1)) != 0
    return torch.bitwise_xor(bits, inexact.to(bits.dtype)).view(t.dtype)


# A sum or mean of one term, a product with an inner dimension of 1: exact on every CPU (one rounding
# at most, of identical inputs), so not moved.
_ONE_TERM_REDUCTIONS = {"sum", "nansum", "mean", "nanmean", "prod", "logsumexp", "norm", "linalg_vector_norm",
                        "var_mean", "std_mean"}
_PRODUCTS = {"mm", "bmm", "addmm", "baddbmm", "addmv", "mv", "dot", "vdot", "addbmm"}


def _one_term(name: str, args) -> bool:
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if not tensors:
        return False
    if name in _ONE_TERM_REDUCTIONS:
        return tensors[0].numel() <= 1 or _reduced_size(tensors[0], args) == 1
    if name in _PRODUCTS:
        a = tensors[1] if name in ("addmm", "baddbmm", "addmv", "addbmm") and len(tensors) > 2 else tensors[0]
        return a.dim() > 0 and a.shape[-1] == 1
    return False


def _reduced_size(x: torch.Tensor, args) -> int:
    """How many terms each result of a reduction of x sums (x.numel() when unsure: then it is moved)."""
    first = 2 if len(args) > 1 and isinstance(args[1], (int, float)) and not isinstance(args[1], bool) \
        and not isinstance(args[1], (list, tuple)) and len(args) > 2 else 1   # norm(x, p, dim)
    dims = next((a for a in args[first:] if isinstance(a, (list, tuple, int)) and not isinstance(a, bool)), None)
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return x.numel()
    dims = [dims] if isinstance(dims, int) else list(dims)
    try:
        size = 1
        for d in dims:
            size *= x.shape[d] if x.dim() else 1
        return size
    except (IndexError, TypeError):
        return x.numel()


_DECISION: dict = {}   # OpOverload -> its packet name if it is perturbed, else None (looked up once per op)


class PerturbedArithmetic(TorchDispatchMode):
    """Moves the results of :data:`PERTURBED` operations by one ulp (see the module docstring)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        try:
            name = _DECISION[func]
        except KeyError:
            packet = func.overloadpacket.__name__.rstrip("_")
            name = _DECISION[func] = packet if packet in PERTURBED else None
        if name is None or _one_term(name, args):
            return out
        mutable = func._schema.is_mutable
        outs = out if isinstance(out, (tuple, list)) else (out,)
        new = []
        for o in outs:
            if isinstance(o, torch.Tensor) and (o.is_floating_point() or o.is_complex()) and o.device.type != "meta":
                p = perturb(o)
                if mutable:                                    # in-place or out=: write into the given tensor
                    with torch.no_grad():
                        o.copy_(p)
                    p = o
                counts[name] = counts.get(name, 0) + 1
                new.append(p)
            else:
                new.append(o)
        if isinstance(out, tuple):
            return tuple(new)
        if isinstance(out, list):
            return new
        return new[0]
