r"""Diagnosing checkers for the RoPE exercises of notebooks 01 and 02 ("write it from memory").

* :func:`check_rotation_matrix` -- notebook 01: the learner's ``R_m(m, d, base=10000)``, the
  dense block-diagonal rotation of RoFormer eq. (15), against
  :func:`helpers.rope.rotation_matrix`.
* :func:`check_rope_interleaved`, :func:`check_rope_half` -- notebook 02: the learner's
  element-wise ``rope(x, positions=None)`` in the interleaved layout (pairs ``2i, 2i+1``,
  RoFormer eq. 34) or the half layout (pairs ``i, i + d/2``, ``rotate_half``), against
  :func:`helpers.rope.apply_rope`.

Each ships its worked solution (``rotation_matrix_solution``, ``rope_interleaved_solution``,
``rope_half_solution``: written as a learner would, they PASS) and its planted mistakes
(``ROTATION_MATRIX_MISTAKES``, ``ROPE_INTERLEAVED_MISTAKES``, ``ROPE_HALF_MISTAKES``:
``{name: function}``; the advice printed for each is in ``ROTATION_MATRIX_ADVICE`` and
``ROPE_ADVICE``). All run on :func:`helpers.practice.engine.diagnose`: PASS, the planted
mistake the learner's results reproduce on every input, or the first input where they differ
and by how much; an exception in the learner's code is reported, never raised.

Paper: Su et al., "RoFormer: Enhanced Transformer with Rotary Position Embedding" (2021).
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import torch

from ..rope import apply_rope, rotation_matrix
from .engine import CheckResult, Reject, TestInput, as_tensor_result, clone_args, run_check

__all__ = [
    "check_rotation_matrix", "rotation_matrix_solution", "ROTATION_MATRIX_MISTAKES", "ROTATION_MATRIX_ADVICE",
    "check_rope_interleaved", "check_rope_half", "rope_interleaved_solution", "rope_half_solution",
    "ROPE_INTERLEAVED_MISTAKES", "ROPE_HALF_MISTAKES", "ROPE_ADVICE",
]


# =========================================================== notebook 01: the matrix R_m
def rotation_matrix_solution(m, d, base=10000):
    """Worked solution: ``R_m`` ``(d, d)``, block ``i`` = rotation by ``m * base**(-2i/d)`` on dims ``2i, 2i+1``."""
    R = torch.zeros(d, d, dtype=torch.float64)
    for i in range(d // 2):
        theta = base ** (-2 * i / d)
        c, s = math.cos(m * theta), math.sin(m * theta)
        R[2 * i, 2 * i], R[2 * i, 2 * i + 1] = c, -s
        R[2 * i + 1, 2 * i], R[2 * i + 1, 2 * i + 1] = s, c
    return R


def _blocks(m, d, base, *, half=False, degrees=False, exponent=2, offset=0, transposed=False):
    """``R_m`` with one knob turned: pairs ``(i, i + d/2)``, angle read as degrees, ``theta_i =
    base**(-exponent*(i + offset)/d)``, or each 2x2 block transposed."""
    R = torch.zeros(d, d, dtype=torch.float64)
    for i in range(d // 2):
        a, b = (i, i + d // 2) if half else (2 * i, 2 * i + 1)
        angle = m * base ** (-exponent * (i + offset) / d)
        if degrees:
            angle = math.radians(angle)
        c, s = math.cos(angle), math.sin(angle)
        if transposed:
            s = -s
        R[a, a], R[a, b], R[b, a], R[b, b] = c, -s, s, c
    return R


def _rm_half_layout(m, d, base=10000):
    return _blocks(m, d, base, half=True)


def _rm_degrees(m, d, base=10000):
    return _blocks(m, d, base, degrees=True)


def _rm_exponent_i(m, d, base=10000):
    return _blocks(m, d, base, exponent=1)


def _rm_exponent_dimension(m, d, base=10000):
    return _blocks(m, d, base, exponent=4)


def _rm_one_indexed(m, d, base=10000):
    return _blocks(m, d, base, offset=1)


def _rm_transposed(m, d, base=10000):
    return _blocks(m, d, base, transposed=True)


ROTATION_MATRIX_MISTAKES: dict[str, Callable] = {
    "half_layout_pairs": _rm_half_layout,
    "degrees_not_radians": _rm_degrees,
    "theta_exponent_i_over_d": _rm_exponent_i,
    "theta_uses_dimension_index": _rm_exponent_dimension,
    "theta_one_indexed": _rm_one_indexed,
    "transposed_blocks": _rm_transposed,
}

ROTATION_MATRIX_ADVICE: dict[str, str] = {
    "half_layout_pairs": (
        "Wrong pairing (half_layout_pairs): your 2x2 blocks rotate dimensions (i, i + d/2), the half "
        "layout of GPT-NeoX. R_m of the notes (RoFormer eq. 15) is block-diagonal: block i sits on the "
        "adjacent dimensions (2i, 2i+1)."
    ),
    "degrees_not_radians": (
        "Degrees vs radians (degrees_not_radians): the angle m*theta_i is already in radians; converting it "
        "(math.radians, * pi/180) shrinks every rotation 57-fold. Use math.cos(m * theta_i) directly."
    ),
    "theta_exponent_i_over_d": (
        "Wrong frequency (theta_exponent_i_over_d): theta_i = base**(-i/d). Pair i rotates at "
        "theta_i = base**(-2i/d), i = 0 .. d/2 - 1, so the slowest pair is base**(-(d-2)/d), close to "
        "1/base (the exponent runs over the even dimensions 2i, as in the sinusoidal encoding)."
    ),
    "theta_uses_dimension_index": (
        "Dimension index in the exponent (theta_uses_dimension_index): your theta is base**(-2j/d) with j the "
        "dimension 2i (a loop over range(0, d, 2)), i.e. base**(-4i/d): every pair after the first turns too "
        "slowly. With the loop variable j = 2i already even, write base**(-j/d); with the pair index i, base**(-2i/d)."
    ),
    "theta_one_indexed": (
        "Pairs counted from 1 (theta_one_indexed): your theta_i is base**(-2(i+1)/d), so even pair 0 turns "
        "slower than 1 rad per position. RoFormer's eq. 15 counts theta_1 .. theta_{d/2} = base**(-2(i-1)/d); "
        "with i = 0 .. d/2 - 1 (as in the notes and in code) it is base**(-2i/d), and theta_0 = 1."
    ),
    "transposed_blocks": (
        "Transposed blocks (transposed_blocks): your blocks are [[cos, sin], [-sin, cos]], a rotation by "
        "-m*theta_i (R_m transposed = R_{-m}). RoFormer's block is [[cos, -sin], [sin, cos]]: the minus "
        "sign sits top right."
    ),
}


def _rm_call(f: Callable) -> Callable:
    def run(m, d, base):
        out = f(m, d) if base == 10000 else f(m, d, base=base)
        return as_tensor_result(out, f"R_m as a ({d}, {d}) tensor")

    return run


def _rm_reference(m, d, base):
    return rotation_matrix(m, d, base, dtype=torch.float64)


def _rm_inputs() -> list[TestInput]:
    cases = [(3, 8, 10000), (1, 2, 10000), (7, 6, 10000), (0, 4, 10000), (20, 16, 100)]
    return [TestInput(f"at m={m}, d={d}" + ("" if base == 10000 else f", base={base}"), (m, d, base),
                      f"R_m({m}, {d}" + ("" if base == 10000 else f", base={base}") + ")")
            for m, d, base in cases]


def check_rotation_matrix(fn: Callable) -> CheckResult:
    r"""Check the learner's ``R_m(m, d, base=10000)`` against :func:`helpers.rope.rotation_matrix`.

    ``fn(m, d)`` (and ``fn(m, d, base=100)``) must return the ``(d, d)`` block-diagonal matrix
    :math:`R_m` whose block :math:`i` is :math:`\begin{bmatrix}\cos m\theta_i & -\sin m\theta_i\\
    \sin m\theta_i & \cos m\theta_i\end{bmatrix}` on dimensions ``2i, 2i+1``, :math:`\theta_i =
    \text{base}^{-2i/d}` (a tensor, or a NumPy array). Compared (``atol`` 1e-5) at ``(m, d)`` =
    (3, 8), (1, 2), (7, 6), (0, 4) and (20, 16) with base 100. Planted mistakes:
    :data:`ROTATION_MATRIX_MISTAKES`.

    Returns:
        :class:`~helpers.practice.engine.CheckResult`; ``print`` it. Never raises on the learner's errors.

    Raises:
        TypeError: if ``fn`` is not a function.
    """
    return run_check(
        fn, _rm_call, _rm_reference, ROTATION_MATRIX_MISTAKES, ROTATION_MATRIX_ADVICE, _rm_inputs(),
        unknown_hint="Check: block i on dims (2i, 2i+1); theta_i = base**(-2i/d); angle m*theta_i in radians; "
                     "[[cos, -sin], [sin, cos]].",
        pass_message="PASS: your R_m equals helpers.rotation_matrix at 5 (m, d, base) settings "
                     "(d = 2 to 16, m = 0 to 20, base 10000 and 100).",
    )


# ======================================================= notebook 02: element-wise RoPE
def _angles(x: torch.Tensor, positions, dtype: Optional[torch.dtype] = None, start: int = 0, exponent: int = 2):
    """cos, sin ``(seq, d/2)`` of ``m * 10000**(-exponent*i/d)`` (2 is right), computed in ``dtype`` (float32
    by default)."""
    seq, d = x.shape[-2], x.shape[-1]
    dtype = torch.float32 if dtype is None else dtype
    pos = torch.arange(start, start + seq, device=x.device) if positions is None else positions
    theta = 10000.0 ** (-exponent * torch.arange(0, d // 2, device=x.device, dtype=dtype) / d)  # (d/2,)
    angle = pos.to(dtype)[:, None] * theta                                           # (seq, d/2)
    return angle.cos().to(x.dtype), angle.sin().to(x.dtype)


def rope_interleaved_solution(x, positions=None):
    """Worked solution, interleaved layout: pair ``(x[2i], x[2i+1])`` rotated by ``m * theta_i``.

    ``x`` ``(..., seq, d)``; ``positions`` ``(seq,)`` ints, default ``0 .. seq-1``. Angles in float32
    whatever ``x``'s dtype.
    """
    seq, d = x.shape[-2], x.shape[-1]
    pos = torch.arange(seq, device=x.device) if positions is None else positions
    theta = 10000.0 ** (-torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)  # (d/2,)
    angle = pos.float()[:, None] * theta                          # (seq, d/2), float32 even for bf16 x
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]                           # the two members of each pair
    return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)


def rope_half_solution(x, positions=None):
    """Worked solution, half layout: pair ``(x[i], x[i + d/2])``; ``x * cos + rotate_half(x) * sin``."""
    seq, d = x.shape[-2], x.shape[-1]
    pos = torch.arange(seq, device=x.device) if positions is None else positions
    inv_freq = 1.0 / 10000.0 ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    freqs = torch.outer(pos.float(), inv_freq)                    # (seq, d/2) angles, in float32
    emb = torch.cat([freqs, freqs], dim=-1)                       # (seq, d): pair i at i and i + d/2
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    rotate_half = torch.cat([-x[..., d // 2:], x[..., : d // 2]], dim=-1)
    return x * cos + rotate_half * sin


# ---- planted mistakes (each the solution with one change)
def _il_sin_sign(x, positions=None):
    cos, sin = _angles(x, positions)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos + x2 * sin, x2 * cos - x1 * sin], dim=-1).flatten(-2)


def _half_sin_sign(x, positions=None):
    cos, sin = _angles(x, positions)
    cos, sin = torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)
    h = x.shape[-1] // 2
    rotate_half = torch.cat([x[..., h:], -x[..., :h]], dim=-1)  # the minus on the wrong half
    return x * cos + rotate_half * sin


def _mixed_rotate_half(x, positions=None):
    """rotate_half's partner (i + d/2) with cos/sin repeated per adjacent pair (repeat_interleave)."""
    cos, sin = _angles(x, positions)
    cos, sin = cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)
    h = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., h:], x[..., :h]], dim=-1) * sin


def _mixed_every_two(x, positions=None):
    """The adjacent partner (-x[2i+1], x[2i]) with cos/sin laid out as two halves (cat)."""
    cos, sin = _angles(x, positions)
    cos, sin = torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)
    partner = torch.stack([-x[..., 1::2], x[..., 0::2]], dim=-1).flatten(-2)
    return x * cos + partner * sin


def _rotate(x, cos, sin, layout: str):
    """The solutions' rotation given cos/sin ``(seq, d/2)``, in ``layout``."""
    if layout == "half":
        cos, sin = torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)
        h = x.shape[-1] // 2
        return x * cos + torch.cat([-x[..., h:], x[..., :h]], dim=-1) * sin
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)


def _input_dtype_angles(layout: str) -> Callable:
    def rope(x, positions=None):
        # angles rounded to x's dtype (bfloat16: spacing 16 between representable numbers near 3000)
        return _rotate(x, *_angles(x, positions, dtype=x.dtype), layout)

    rope.__name__ = f"rope_{layout}_angles_in_input_dtype"
    return rope


def _start_at_1(layout: str) -> Callable:
    def rope(x, positions=None):
        return _rotate(x, *_angles(x, positions, start=1), layout)  # default positions 1 .. seq

    rope.__name__ = f"rope_{layout}_positions_start_at_1"
    return rope


def _exponent_i_over_d(layout: str) -> Callable:
    def rope(x, positions=None):
        return _rotate(x, *_angles(x, positions, exponent=1), layout)  # theta_i = 10000**(-i/d)

    rope.__name__ = f"rope_{layout}_theta_exponent_i_over_d"
    return rope


ROPE_INTERLEAVED_MISTAKES: dict[str, Callable] = {
    "theta_exponent_i_over_d": _exponent_i_over_d("interleaved"),
    "sin_sign_wrong_half": _il_sin_sign,
    "layouts_mixed": _mixed_rotate_half,
    "wrong_layout": rope_half_solution,
    "angles_in_input_dtype": _input_dtype_angles("interleaved"),
    "positions_start_at_1": _start_at_1("interleaved"),
}

ROPE_HALF_MISTAKES: dict[str, Callable] = {
    "theta_exponent_i_over_d": _exponent_i_over_d("half"),
    "sin_sign_wrong_half": _half_sin_sign,
    "layouts_mixed": _mixed_rotate_half,
    "wrong_layout": rope_interleaved_solution,
    "angles_in_input_dtype": _input_dtype_angles("half"),
    "positions_start_at_1": _start_at_1("half"),
}

ROPE_ADVICE: dict[str, str] = {
    "theta_exponent_i_over_d": (
        "Wrong frequency (theta_exponent_i_over_d): your theta_i = 10000**(-i/d) with i the pair index. Pair i "
        "rotates at theta_i = 10000**(-2i/d), i = 0 .. d/2 - 1 (or 10000**(-j/d) with j = 0, 2, 4, ... the even "
        "dimension, as torch.arange(0, d, 2) gives)."
    ),
    "sin_sign_wrong_half": (
        "Sign of sin on the wrong member of each pair (sin_sign_wrong_half): you rotate by -m*theta_i. "
        "The rotation is (a cos - b sin, b cos + a sin): the first member gets -b*sin. Interleaved: "
        "partner (-x[2i+1], x[2i]); half: rotate_half(x) = cat(-x[d/2:], x[:d/2])."
    ),
    "layouts_mixed": (
        "Two layouts mixed (layouts_mixed): the partner vector and the cos/sin tables pair dimensions "
        "differently, e.g. rotate_half (pairs i, i + d/2) with cos/sin repeated per adjacent pair "
        "(repeat_interleave), or the adjacent partner (-x[2i+1], x[2i]) with cat([cos, cos]). Pick one "
        "layout for both: interleaved = adjacent partner + repeat_interleave(2); half = rotate_half + "
        "cat([cos, cos])."
    ),
    "wrong_layout": (
        "The other layout (wrong_layout): your rotation is correct but pairs the dimensions of the other "
        "layout. Interleaved pairs (2i, 2i+1) (the notes, RoFormer, Meta's Llama); half pairs (i, i + d/2) "
        "(GPT-NeoX, Hugging Face's rotate_half). The two differ by a fixed permutation of the dimensions "
        "(helpers.interleaved_to_half)."
    ),
    "angles_in_input_dtype": (
        "Angles computed in the input's dtype (angles_in_input_dtype): with bfloat16 input, the positions "
        "and m*theta_i are rounded to 8 significant bits (near m = 3000 consecutive positions share one "
        "value, spacing 16), so the rotation angles are off by radians. Compute positions, theta and "
        "m*theta in float32, then cast cos/sin to x.dtype."
    ),
    "positions_start_at_1": (
        "Positions start at 1 (positions_start_at_1): with no positions given, the first token must be "
        "rotated at m = 0 (R_0 = identity): positions = torch.arange(seq), not arange(1, seq + 1)."
    ),
}

#: Other ways of writing a mistake above, tried after them (same name, same advice).
_ROPE_VARIANTS = [("layouts_mixed", _mixed_every_two)]


def _rope_call(f: Callable) -> Callable:
    def run(x, positions):
        args = clone_args([x] if positions is None else [x, positions])
        out = as_tensor_result(f(*args), f"a tensor of shape {tuple(x.shape)}")
        if out.dtype != x.dtype and out.shape == x.shape:
            # A float32 result for bfloat16 input: the numbers may be right, but attention then mixes dtypes
            # (F.scaled_dot_product_attention refuses q, k in float32 with v in bfloat16).
            raise Reject("output_dtype", f"your rope returned {out.dtype} for {x.dtype} input: return the rotated x in "
                         "its own dtype (compute the angles and the rotation in float32, then cast the result with "
                         ".to(x.dtype) or .type_as(x))", float("inf"))
        return out

    return run


def _rope_inputs(seed: int) -> list[TestInput]:
    g = torch.Generator().manual_seed(seed)
    cases = [
        ("(2, 3, 5, 8) float32", (2, 3, 5, 8), torch.float32, None),
        ("(1, 7, 6) float32 (a batch of 1, d/2 odd)", (1, 7, 6), torch.float32, None),
        ("(4, 2) float32 (one pair)", (4, 2), torch.float32, None),
        ("(2, 5, 8) float32 at positions [0, 3, 10, 11, 40]", (2, 5, 8), torch.float32,
         torch.tensor([0, 3, 10, 11, 40])),
        ("(1, 2, 7, 16) bfloat16 at positions 3000..3006", (1, 2, 7, 16), torch.bfloat16,
         torch.arange(3000, 3007)),
    ]
    out = []
    for label, shape, dtype, pos in cases:
        x = (torch.randn(*shape, generator=g) * 2).to(dtype)
        call = "rope(x)" if pos is None else "rope(x, positions)"
        # bfloat16: the reference rounds each product to 8 bits, a learner may round differently
        # (or keep float32): a few units in the last place of |x| <= 8, far below the mistakes' errors.
        tol = (0.1, 0.02) if dtype == torch.bfloat16 else (1e-4, 1e-4)
        out.append(TestInput(f"on x {label}", (x, pos), call, *tol))
    return out


def _check_rope(fn: Callable, layout: str, mistakes: dict, seed: int) -> CheckResult:
    def reference(x, positions):
        return apply_rope(x, positions, layout=layout)

    return run_check(
        fn, _rope_call, reference, mistakes, ROPE_ADVICE, _rope_inputs(seed), variants=_ROPE_VARIANTS,
        unknown_hint=("Check: theta_i = 10000**(-2i/d); angles m*theta_i in float32; "
                      + ("pairs (2i, 2i+1): (a cos - b sin, b cos + a sin)." if layout == "interleaved"
                         else "x*cat(cos, cos) + rotate_half(x)*cat(sin, sin), rotate_half = cat(-x2, x1).")),
        pass_message=f"PASS: your rope equals helpers.apply_rope(layout={layout!r}) on 5 inputs: 2-D to 4-D, "
                     f"odd lengths, a batch of 1, given positions, bfloat16 at positions 3000..3006.",
    )


def check_rope_interleaved(fn: Callable, seed: int = 0) -> CheckResult:
    r"""Check the learner's element-wise RoPE, interleaved layout, against ``helpers.apply_rope``.

    ``fn(x)`` and ``fn(x, positions)``: ``x`` ``(..., seq, d)`` (float32 or bfloat16),
    ``positions`` a ``(seq,)`` int tensor (default ``0 .. seq-1``); returns ``x`` with pair
    ``(x[2i], x[2i+1])`` rotated by :math:`m\theta_i`, :math:`\theta_i = 10000^{-2i/d}`
    (RoFormer eq. 34). Inputs: ``(2, 3, 5, 8)``, ``(1, 7, 6)``, ``(4, 2)``, ``(2, 5, 8)`` at
    given positions, and ``(1, 2, 7, 16)`` in bfloat16 at positions 3000..3006 (compared with
    ``atol`` 0.1: what tells angles computed in bfloat16, off by radians, from rounding).
    Planted mistakes: :data:`ROPE_INTERLEAVED_MISTAKES`.

    Returns:
        :class:`~helpers.practice.engine.CheckResult`; ``print`` it. Never raises on the learner's errors.
    """
    return _check_rope(fn, "interleaved", ROPE_INTERLEAVED_MISTAKES, seed)


def check_rope_half(fn: Callable, seed: int = 0) -> CheckResult:
    r"""Check the learner's element-wise RoPE, half layout (``rotate_half``), against ``helpers.apply_rope``.

    As :func:`check_rope_interleaved`, with pair ``(x[i], x[i + d/2])``:
    ``x * cat(cos, cos) + rotate_half(x) * cat(sin, sin)``, ``rotate_half(x) = cat(-x[d/2:], x[:d/2])``
    (GPT-NeoX, Hugging Face Llama). Planted mistakes: :data:`ROPE_HALF_MISTAKES`.
    """
    return _check_rope(fn, "half", ROPE_HALF_MISTAKES, seed)
