r"""Rotary position embedding (RoPE): the reference implementations of the series.

Taught in ``notebooks/01_rope_rotation_matrix.ipynb`` (the block-diagonal rotation matrix
:math:`R_m`) and ``notebooks/02_rope_efficient.ipynb`` (the element-wise, half-split and complex
forms, and the cos/sin table); ``notebooks/appendix/02a_rope_cost_on_a_cpu.ipynb`` measures them.
Paper: Su et al., "RoFormer: Enhanced Transformer with Rotary Position Embedding" (2021),
eqs. (13)-(16) and (34).

Conventions used throughout the series:

* Rotated tensors have shape ``(..., seq, head_dim)``: one position per row of the
  second-to-last dimension, RoPE acting on the last.
* ``head_dim`` (:math:`d`) is even; pair :math:`i` (``0 <= i < d/2``) turns by the angle
  :math:`m\theta_i` at position :math:`m`, with :math:`\theta_i = \text{base}^{-2i/d}`.
* ``layout="interleaved"`` pairs dimensions ``(2i, 2i+1)`` (the notes, RoFormer, GPT-J, Meta's
  original Llama); ``layout="half"`` pairs ``(i, i + d/2)`` (GPT-NeoX, Hugging Face Llama).
* Angles are float32 (float64 for float64 input) whatever the input dtype; the output has the
  input's dtype.

Two options stretch RoPE to longer sequences (notebook 06), one line of math each:
``scale=s`` is position interpolation (Chen et al. 2023): :math:`m \to m/s`;
``ntk_scale=s`` is NTK-aware scaling (bloc97 2023; Peng et al. 2023, YaRN, sec. 3.1):
:math:`\text{base} \to \text{base}\cdot s^{d/(d-2)}` (:func:`ntk_scaled_base`).

Arguments are checked once, at each public function, by :mod:`helpers.validate`. A fused C
kernel for float16/bfloat16 is a measuring instrument, not part of this module:
:func:`helpers.lab.rope_kernel.fused_apply_rope` (opt-in, appendix 02a §3).
"""
from __future__ import annotations

import functools
import math
from typing import Optional, Sequence, Union

import torch

from .validate import check_choice, check_even, check_int, check_number, check_tensor

__all__ = [
    "LAYOUTS",
    "rope_frequencies",
    "rope_angles",
    "rotation_matrix",
    "apply_rope_matrix",
    "apply_rope",
    "rope_cos_sin",
    "apply_rope_complex",
    "interleaved_to_half",
    "half_to_interleaved",
    "interleaved_to_half_index",
    "RotaryEmbedding",
    "ntk_scaled_base",
    "llama3_frequencies",
]

LAYOUTS = ("interleaved", "half")
PositionsLike = Union[None, int, Sequence[int], Sequence[float], torch.Tensor]
_PAIRS = "RoPE rotates pairs of dimensions"  # why head_dim must be even, in the errors
_NO_SCALING = "a finite number > 0 (1 = no scaling)"
_LOW_PRECISION = (torch.float16, torch.bfloat16)


def _angle_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 for float64 input, float32 for everything else (float16, bfloat16, float32)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


# ----------------------------------------------------------------- frequencies, angles
def rope_frequencies(
    head_dim: int, base: float = 10000.0, dtype: torch.dtype = torch.float32, device=None
) -> torch.Tensor:
    r"""The rotation frequencies :math:`\theta_i = \text{base}^{-2i/d}`, ``i = 0 .. d/2-1``.

    Args:
        head_dim: :math:`d`, even and >= 2.
        base: the base of the geometric progression (10000 in RoFormer and the
            Transformer's sinusoidal encoding).
        dtype: float32 (default) or float64.

    Returns:
        Tensor of shape ``(head_dim // 2,)``; ``theta[0] == 1`` (fastest pair), the last is
        the slowest, :math:`\text{base}^{-(d-2)/d}`.
    """
    check_even(head_dim, "head_dim", _PAIRS)
    base = check_number(base, "base")
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"dtype must be torch.float32 or torch.float64 (angles need it), got {dtype}")
    i = torch.arange(0, head_dim // 2, dtype=torch.float64)
    theta = base ** (-2.0 * i / head_dim)  # in float64, rounded once: the same numbers on every device
    return theta.to(dtype=dtype, device=device)


def rope_angles(
    positions: PositionsLike,
    head_dim: int,
    base: float = 10000.0,
    dtype: torch.dtype = torch.float32,
    device=None,
) -> torch.Tensor:
    r"""The angles :math:`m\theta_i` as a ``(..., seq, head_dim // 2)`` tensor.

    ``positions`` is an int (``seq``, meaning positions ``0 .. seq-1``), a sequence or a
    tensor of positions (integers or, for interpolated positions, floats). A float16 or
    bfloat16 position tensor raises ``TypeError``: those dtypes round the positions
    themselves (bfloat16 holds integers exactly only up to 256), as in :func:`apply_rope`.
    """
    check_even(head_dim, "head_dim", _PAIRS)
    if not isinstance(positions, int) or isinstance(positions, bool):  # a tensor, a list, a bool: its dtype checked
        _check_positions_dtype(torch.as_tensor(positions))
    if isinstance(positions, int) and not isinstance(positions, bool):
        if positions < 0:
            raise ValueError(f"positions as an int is a sequence length and must be >= 0, got {positions}")
        pos = torch.arange(positions, dtype=dtype, device=device)
    else:
        pos = torch.as_tensor(positions, dtype=dtype, device=device)
        if pos.dim() == 0:
            pos = pos.reshape(1)
    return pos[..., None] * rope_frequencies(head_dim, base, dtype=dtype, device=device)  # m θ_i


def ntk_scaled_base(base: float, scale: float, head_dim: int) -> float:
    r"""The NTK-aware RoPE base for stretching the context by a factor ``scale`` = :math:`s`.

    .. math::
        \text{base}' = \text{base}\cdot s^{d/(d-2)}
        \quad\Rightarrow\quad
        \theta'_i = \text{base}'^{-2i/d} = \theta_i\, s^{-2i/(d-2)}

    Pair 0 (the fastest: local detail) keeps its frequency; the slowest pair
    (:math:`i = d/2-1`) is divided by exactly :math:`s`, as position interpolation divides
    every pair. bloc97 (2023), "NTK-Aware Scaled RoPE allows LLaMA models to have extended
    (8k+) context size without any fine-tuning"; Peng et al. (2023, YaRN), sec. 3.1.

    Args:
        base: the trained base, > 0 (10000 in RoFormer).
        scale: :math:`s = L'/L`, > 0 (1 returns ``base``).
        head_dim: :math:`d`, even and >= 4 (the exponent needs :math:`d > 2`).

    Returns:
        The new base (a float).
    """
    base = check_number(base, "base")
    scale = check_number(scale, "scale", _NO_SCALING)
    check_even(head_dim, "head_dim", _PAIRS)
    if head_dim < 4:
        raise ValueError(f"head_dim must be >= 4 for NTK scaling (the exponent d/(d-2) needs d > 2), got {head_dim}")
    return base * scale ** (head_dim / (head_dim - 2))


def llama3_frequencies(
    head_dim: int,
    base: float = 500000.0,
    factor: float = 8.0,
    low_freq_factor: float = 1.0,
    high_freq_factor: float = 4.0,
    original_max_position_embeddings: int = 8192,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    r"""Llama 3.1's rescaled RoPE frequencies (``rope_type="llama3"``), per rotation pair.

    With :math:`\theta_i = \text{base}^{-2i/d}` (:func:`rope_frequencies`), wavelength
    :math:`\lambda_i = 2\pi/\theta_i`, :math:`L` = ``original_max_position_embeddings``,
    :math:`s` = ``factor``, :math:`\alpha, \beta` = ``low_freq_factor``, ``high_freq_factor``:

    .. math::
        \theta'_i = \begin{cases}
        \theta_i & \lambda_i < L/\beta \quad\text{(fast pairs: unchanged)}\\
        \theta_i / s & \lambda_i > L/\alpha \quad\text{(slow pairs: position interpolation)}\\
        (1-\gamma_i)\,\theta_i/s + \gamma_i\,\theta_i, \ \gamma_i = \dfrac{L/\lambda_i - \alpha}{\beta-\alpha} & \text{otherwise}
        \end{cases}

    Pairs that turn fewer than :math:`\alpha` times over the original context are
    interpolated by :math:`s` (notebook 06), pairs that turn more than :math:`\beta` times are
    left alone, and those in between are blended linearly in :math:`L/\lambda_i`. Meta's
    Llama 3.1 reference code (``apply_scaling`` in ``meta-llama/llama-models``) with
    :math:`s=8, \alpha=1, \beta=4, L=8192`; the original Llama 3 (8B, 70B) used plain RoPE
    with base 500000. Same rule as ``_compute_llama3_parameters`` in ``transformers``'
    ``modeling_rope_utils.py`` (5.24.0).

    Args:
        head_dim: :math:`d`, even.
        base: RoPE base (500000 in Llama 3).
        factor: :math:`s > 0`.
        low_freq_factor, high_freq_factor: :math:`0 < \alpha < \beta`.
        original_max_position_embeddings: :math:`L` >= 1, the pre-training context.
        dtype: float32 (default) or float64.

    Returns:
        ``(head_dim // 2,)`` frequencies, computed in float64 and rounded once to ``dtype``.
    """
    check_even(head_dim, "head_dim", _PAIRS)
    factor = check_number(factor, "factor")
    low = check_number(low_freq_factor, "low_freq_factor")
    high = check_number(high_freq_factor, "high_freq_factor")
    if not low < high:
        raise ValueError(f"low_freq_factor must be < high_freq_factor, got {low} and {high}")
    L = check_int(original_max_position_embeddings, "original_max_position_embeddings")
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"dtype must be torch.float32 or torch.float64 (angles need it), got {dtype}")
    theta = rope_frequencies(head_dim, base, dtype=torch.float64)
    wavelen = 2 * math.pi / theta                                     # λ_i
    gamma = (L / wavelen - low) / (high - low)                        # γ_i
    blended = (1 - gamma) * theta / factor + gamma * theta
    out = torch.where(wavelen < L / high, theta, torch.where(wavelen > L / low, theta / factor, blended))
    return out.to(dtype)


# ----------------------------------------------------------------------- the matrix form
def rotation_matrix(
    position: Union[int, float],
    head_dim: int,
    base: float = 10000.0,
    dtype: torch.dtype = torch.float32,
    device=None,
) -> torch.Tensor:
    r"""The dense block-diagonal rotation :math:`R_m` of RoFormer eq. (15), as in the notes.

    .. math::
        R_m = \operatorname{diag}\Big(
        \begin{bmatrix}\cos m\theta_0 & -\sin m\theta_0\\ \sin m\theta_0 & \cos m\theta_0\end{bmatrix},
        \dots,
        \begin{bmatrix}\cos m\theta_{d/2-1} & -\sin m\theta_{d/2-1}\\ \sin m\theta_{d/2-1} & \cos m\theta_{d/2-1}\end{bmatrix}\Big)

    The 2x2 block ``i`` sits on the adjacent dimensions ``2i, 2i+1``.

    Args:
        position: :math:`m`, the absolute position (an int, or a float for interpolated
            positions).
        head_dim: :math:`d`, even and >= 2.
        base: frequency base, > 0.
        dtype: float32 (default) or float64; angles are computed in this dtype.

    Returns:
        Tensor ``(head_dim, head_dim)``.
    """
    check_even(head_dim, "head_dim", _PAIRS)
    base = check_number(base, "base")
    if isinstance(position, torch.Tensor):
        if position.numel() != 1:
            raise ValueError(f"position must be a single number, got a tensor of shape {tuple(position.shape)}")
        position = position.item()
    if isinstance(position, bool) or not isinstance(position, (int, float)) or not math.isfinite(position):
        raise ValueError(f"position must be a finite number, got {position!r}")
    angle = position * rope_frequencies(head_dim, base, dtype=dtype, device=device)  # m θ_i
    cos, sin = torch.cos(angle), torch.sin(angle)
    R = torch.zeros(head_dim, head_dim, dtype=dtype, device=device)
    idx = torch.arange(0, head_dim, 2, device=device)
    R[idx, idx] = cos
    R[idx, idx + 1] = -sin
    R[idx + 1, idx] = sin
    R[idx + 1, idx + 1] = cos
    return R


def apply_rope_matrix(
    x: torch.Tensor, positions: PositionsLike = None, base: float = 10000.0
) -> torch.Tensor:
    r"""Rotate each row of ``x`` by the dense matrix :math:`R_m`: the O(d^2) reference.

    ``out[..., m, :] = R_{p_m} @ x[..., m, :]`` with :math:`p_m` = ``positions[m]``
    (default ``0 .. seq-1``). It builds one ``(d, d)`` matrix per position, so it costs
    :math:`O(\text{seq}\cdot d^2)` time and memory: use it to check, not to run.

    Args:
        x: ``(..., seq, head_dim)``, floating point.
        positions: ``None`` or ``seq`` positions (sequence or 1-D tensor).
        base: frequency base, > 0.

    Returns:
        Tensor of the shape and dtype of ``x``.
    """
    check_tensor(x, "x", min_dim=2, floating=True)
    d = check_even(x.shape[-1], "head_dim (x.shape[-1])", _PAIRS)
    base = check_number(base, "base")
    adt = _angle_dtype(x.dtype)
    pos = _positions_tensor(positions, x.shape[-2], x.device, adt)
    if pos.dim() != 1:
        raise ValueError(f"positions must be 1-D (seq,) for apply_rope_matrix, got shape {tuple(pos.shape)}")
    if x.device.type == "meta":  # no values to build R_p from: the output's shape and dtype are x's
        return torch.empty_like(x)
    R = torch.stack([rotation_matrix(float(p), d, base, dtype=adt, device=x.device) for p in pos])
    return torch.einsum("mij,...mj->...mi", R, x.to(adt)).to(x.dtype)


# ---------------------------------------------------------------- the element-wise form
@functools.lru_cache(maxsize=16)
def _cached_tables(
    seq: int, head_dim: int, base: float, device: str, float64: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    r"""cos, sin ``(seq, d/2)`` and :math:`e^{im\theta_i}` = ``cos + i sin`` of the angles
    :math:`m\theta_i`, positions ``m = 0 .. seq-1``, in float64 if ``float64`` else float32 (memoised).

    Meta's Llama (``freqs_cis``) and vLLM (``cos_sin_cache``) keep such a table; Hugging Face
    ``transformers`` 5.24 recomputes cos/sin once per forward (appendix 02a §2, notebook 07 §6).
    """
    with torch.inference_mode(False), torch.no_grad():  # a table built under inference_mode serves training later
        adt = torch.float64 if float64 else torch.float32
        angle = torch.arange(seq, device=device, dtype=adt)[:, None] * rope_frequencies(head_dim, base, adt, device)
        cos, sin = torch.cos(angle), torch.sin(angle)
        return cos, sin, torch.complex(cos, sin)


def _complex_viewable(x: torch.Tensor) -> bool:
    """Can the pairs of ``x`` be viewed as complex numbers without a copy (even strides and offset)?"""
    return x.stride(-1) == 1 and x.storage_offset() % 2 == 0 and all(s % 2 == 0 for s, n in zip(x.stride()[:-1], x.shape[:-1]) if n > 1)


def _members(x: torch.Tensor, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The two members ``(x_a, x_b)`` of every pair, as views: ``(x_{2i}, x_{2i+1})`` or ``(x_i, x_{i+d/2})``."""
    if layout == "interleaved":
        return x[..., 0::2], x[..., 1::2]
    return x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]


def _rotate(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str, rot: Optional[torch.Tensor] = None
) -> torch.Tensor:
    r"""Rotate every pair ``(x_a, x_b)`` of ``x`` by its angle, given ``cos``, ``sin`` (and, if at
    hand, ``rot`` = ``cos + i sin``), broadcastable to ``(..., seq, d/2)``, in the angle dtype:

    .. math::
        (x_a, x_b) \mapsto (x_a\cos m\theta_i - x_b\sin m\theta_i,\ x_b\cos m\theta_i + x_a\sin m\theta_i)

    Out of place; autograd flows to ``x`` and to the angles.
    """
    if x.dtype in _LOW_PRECISION:  # float32 arithmetic, one rounding back: Meta's Llama (.float() ... .type_as(x))
        return _rotate(x.to(torch.float32, memory_format=torch.contiguous_format), cos, sin, layout, rot).to(x.dtype)
    if layout == "interleaved" and _complex_viewable(x):
        z = torch.view_as_complex(x.unflatten(-1, (x.shape[-1] // 2, 2)))  # z_i = x_{2i} + i x_{2i+1}, no copy
        return torch.view_as_real(z * (torch.complex(cos, sin) if rot is None else rot)).flatten(-2)  # z_i e^{i m θ_i}
    # RoFormer eq. 34: x ⊙ (cos, cos) + (-x_b, x_a) ⊙ (sin, sin), the sin terms added by addcmul_ (one operator;
    # on AVX2/AVX-512 CPUs a fused multiply-add)
    xa, xb = _members(x, layout)
    out = x * (torch.stack((cos, cos), -1).flatten(-2) if layout == "interleaved" else torch.cat((cos, cos), -1))
    oa, ob = _members(out, layout)
    oa.addcmul_(xb, sin, value=-1.0)  # x_a cos - x_b sin
    ob.addcmul_(xa, sin)  # x_b cos + x_a sin
    return out


def apply_rope(
    x: torch.Tensor,
    positions: PositionsLike = None,
    base: float = 10000.0,
    layout: str = "interleaved",
    *,
    scale: float = 1.0,
    ntk_scale: float = 1.0,
    frequencies: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    r"""Rotate ``x`` by RoPE in the element-wise form (RoFormer eq. 34).

    For ``layout="interleaved"`` (pairs ``2i, 2i+1``):

    .. math::
        R_m x = x \odot (\cos m\theta_0, \cos m\theta_0, \cos m\theta_1, \dots)
              + (-x_1, x_0, -x_3, x_2, \dots) \odot (\sin m\theta_0, \sin m\theta_0, \dots)

    (:math:`\odot`: element-wise product; RoFormer writes :math:`\otimes`.) For ``layout="half"``
    (pairs ``i, i+d/2``) it is ``x * cat(cos, cos) + rotate_half(x) * cat(sin, sin)`` with
    ``rotate_half(x) = cat(-x[d/2:], x[:d/2])``.

    How it runs (appendix notebook 02a measures each step): the cos/sin table of positions
    ``0 .. seq-1`` is memoised. Interleaved float32/float64 pairs are viewed as complex numbers
    (no copy, when the strides allow) and multiplied by :math:`e^{im\theta_i}` in one pass. The half layout multiplies by
    ``cat(cos, cos)`` and adds each half's sine term with ``addcmul_``. float16/bfloat16 input is
    rotated the same way on a float32 copy and rounded once, as Meta's Llama does.

    Args:
        x: ``(..., seq, head_dim)``, e.g. ``(batch, heads, seq, head_dim)``.
        positions: ``None`` (``0 .. seq-1``), or positions (integers, or floats for
            interpolated positions) of shape

            ``(seq,)`` (every row); ``(batch, seq)``, one row per example: on
            ``(batch, heads, seq, head_dim)`` input example ``b`` uses ``positions[b]`` in every
            head, as Hugging Face does (not right-aligned broadcasting); or as many dimensions as
            ``x.shape[:-1]``, broadcastable to it. Other shapes raise ``ValueError``.
        base: frequency base, > 0.
        layout: ``"interleaved"`` or ``"half"``.
        scale: position interpolation (Chen et al. 2023): every position is divided by
            ``scale`` (> 0; 1 = off). ``scale = L'/L`` maps positions ``0 .. L'-1`` into ``[0, L)``.
        ntk_scale: NTK-aware scaling (bloc97 2023): ``base`` is replaced by
            :func:`ntk_scaled_base` ``(base, ntk_scale, head_dim)`` (> 0; 1 = off).
        frequencies: optional ``(head_dim // 2,)`` tensor of per-pair frequencies
            :math:`\theta_i` replacing ``base ** (-2i/d)`` (``base`` is then unused), e.g.
            :func:`llama3_frequencies`; cast to the angle dtype. Not combinable with ``ntk_scale``.

    Returns:
        Tensor of the shape and dtype of ``x``.
    """
    check_tensor(x, "x", min_dim=2, floating=True)
    d = check_even(x.shape[-1], "head_dim (x.shape[-1])", _PAIRS)
    base = check_number(base, "base")
    check_choice(layout, "layout", LAYOUTS)
    if positions is None and frequencies is None and check_number(scale, "scale", _NO_SCALING) == check_number(ntk_scale, "ntk_scale", _NO_SCALING) == 1:
        cos, sin, rot = _cached_tables(x.shape[-2], d, base, str(x.device), x.dtype == torch.float64)  # m θ_i, m < seq
        return _rotate(x, cos, sin, layout, rot)
    adt = _angle_dtype(x.dtype)
    if check_number(ntk_scale, "ntk_scale", _NO_SCALING) != 1.0:  # NTK-aware: base' = base * s^(d/(d-2))
        if frequencies is not None:
            raise ValueError("frequencies and ntk_scale cannot be combined (both set the frequencies); pass one")
        base = ntk_scaled_base(base, ntk_scale, d)
    if frequencies is None:
        theta = rope_frequencies(d, base, dtype=adt, device=x.device)  # θ_i = base^(-2i/d)
    else:  # given per-pair frequencies, e.g. Llama 3.1's rescaled ones
        theta = _check_frequencies(frequencies, d).to(device=x.device, dtype=adt)
    pos = _positions_tensor(positions, x.shape[-2], x.device, adt, x.shape)  # (batch, seq): per example
    angle = pos[..., None] / check_number(scale, "scale", _NO_SCALING) * theta  # (m / s) θ_i: interpolated positions
    return _rotate(x, torch.cos(angle), torch.sin(angle), layout)


def rope_cos_sin(
    x: torch.Tensor, positions: PositionsLike = None, base: float = 10000.0
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""The float32 ``cos`` and ``sin`` of the angles :math:`m\theta_i` by which ``apply_rope(x, positions, base)``
    turns float16/bfloat16/float32 ``x``, broadcastable to ``(..., seq, head_dim // 2)``; ``positions`` as
    :func:`apply_rope` takes them (``None``: its memoised table). For code that rotates by its own means
    (:func:`helpers.lab.rope_kernel.fused_apply_rope`)."""
    check_tensor(x, "x", min_dim=2, floating=True)
    d = check_even(x.shape[-1], "head_dim (x.shape[-1])", _PAIRS)
    base = check_number(base, "base")
    if positions is None:
        cos, sin, _ = _cached_tables(x.shape[-2], d, base, str(x.device), False)
        return cos, sin
    pos = _positions_tensor(positions, x.shape[-2], x.device, torch.float32, x.shape)
    angle = pos[..., None] * rope_frequencies(d, base, device=x.device)  # m θ_i, as apply_rope
    return torch.cos(angle), torch.sin(angle)


def apply_rope_complex(
    x: torch.Tensor, positions: PositionsLike = None, base: float = 10000.0
) -> torch.Tensor:
    r"""RoPE as complex multiplication (interleaved layout), as in Meta's original Llama.

    Pair ``(x_{2i}, x_{2i+1})`` is the complex number :math:`z_i = x_{2i} + i\,x_{2i+1}`;
    rotating it by :math:`m\theta_i` is :math:`z_i e^{i m\theta_i}`
    (``torch.polar(1, angle)``). Computed in complex64 (complex128 for float64 input).

    Args / Returns: as :func:`apply_rope` with ``layout="interleaved"`` (the same
    ``positions`` shapes: ``(batch, seq)`` positions on ``(batch, heads, seq, head_dim)``
    input are per example, Hugging Face's convention).
    """
    check_tensor(x, "x", min_dim=2, floating=True)
    d = check_even(x.shape[-1], "head_dim (x.shape[-1])", _PAIRS)
    base = check_number(base, "base")
    adt = _angle_dtype(x.dtype)
    pos = _positions_tensor(positions, x.shape[-2], x.device, adt, x.shape)
    angle = pos[..., None] * rope_frequencies(d, base, dtype=adt, device=x.device)
    rot = torch.polar(torch.ones_like(angle), angle)  # e^{i m θ_i}
    z = torch.view_as_complex(x.to(adt).reshape(*x.shape[:-1], d // 2, 2).contiguous())
    return torch.view_as_real(z * rot).flatten(-2).to(x.dtype)


# ------------------------------------------------------------------ layout permutation
def interleaved_to_half_index(head_dim: int) -> torch.Tensor:
    """The index ``perm`` with ``x_half = x_interleaved[..., perm]``: ``(0, 2, 4, ..., 1, 3, 5, ...)``.

    Pair ``i`` sits at ``(2i, 2i+1)`` in the interleaved layout and at ``(i, i + d/2)``
    in the half layout, so the half layout lists the first members of all pairs, then
    the second members.
    """
    check_even(head_dim, "head_dim", _PAIRS)
    return torch.cat([torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)])


def interleaved_to_half(x: torch.Tensor) -> torch.Tensor:
    """Permute the last dimension from the interleaved layout to the half layout.

    ``apply_rope(interleaved_to_half(x), layout="half") ==
    interleaved_to_half(apply_rope(x, layout="interleaved"))``.
    """
    check_even(x.shape[-1], "head_dim (x.shape[-1])", _PAIRS)
    return torch.cat(_members(x, "interleaved"), dim=-1)


def half_to_interleaved(x: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`interleaved_to_half`: ``(a_0..a_{d/2-1}, b_0..) -> (a_0, b_0, a_1, b_1, ...)``."""
    check_even(x.shape[-1], "head_dim (x.shape[-1])", _PAIRS)
    return torch.stack(_members(x, "half"), dim=-1).flatten(-2)


# ------------------------------------------------------------------------- module
def _device_key(device) -> torch.device:
    """``device`` as the ``torch.device`` a tensor created there reports (the cache key).

    ``torch.device("cuda")`` has no index, but a tensor made with it lives on
    ``cuda:<current device>``: an index-less accelerator device gets the index of its
    current device, so both spellings find the same cache entry. ``None`` means the CPU.
    """
    d = torch.device(device) if device is not None else torch.device("cpu")
    if d.index is None and d.type not in ("cpu", "meta"):
        backend = getattr(torch, d.type, None)
        try:
            d = torch.device(d.type, backend.current_device())
        except Exception:  # backend not built or no device: keep the index-less key (nothing is cached there)
            pass
    return d


class RotaryEmbedding(torch.nn.Module):
    r""":func:`apply_rope` as a module with a cos/sin table that grows, as Meta's Llama (``freqs_cis``)
    and vLLM (``cos_sin_cache``) keep one (Hugging Face ``transformers`` 5.24 recomputes cos/sin at
    every forward instead).

    ``forward(x, positions=None)`` rotates ``x`` of shape ``(..., seq, head_dim)`` exactly as
    :func:`apply_rope` with the same arguments does. The table holds positions ``0 .. n-1`` in the
    angle dtype, per device (``"cuda"`` and ``cuda:<current>`` are one key). It is built at the first
    call, and when a longer sequence or a larger integer position arrives it grows to the larger of
    the length needed and twice its length, so it never fails on length (:meth:`cache_len` says how
    long it is). Non-integer positions (e.g. interpolated) are
    computed directly. ``positions`` takes the shapes of :func:`apply_rope`.

    Args:
        head_dim: even, >= 2.
        base: frequency base, > 0.
        layout: ``"interleaved"`` or ``"half"``.
        initial_cache_len: the fewest positions the table holds once built (>= 1); nothing is
            built at construction.
        scale: position interpolation (Chen et al. 2023): positions are divided by ``scale``
            (> 0; 1 = off), as in :func:`apply_rope`.
        ntk_scale: NTK-aware scaling (bloc97 2023): the rotations use
            ``base = ntk_scaled_base(base, ntk_scale, head_dim)`` (> 0; 1 = off).
            ``self.base`` stays the given base; ``self.rotary_base`` is the one used.
    """

    def __init__(
        self,
        head_dim: int,
        base: float = 10000.0,
        layout: str = "interleaved",
        initial_cache_len: int = 256,
        *,
        scale: float = 1.0,
        ntk_scale: float = 1.0,
    ) -> None:
        super().__init__()
        self.head_dim = check_even(head_dim, "head_dim", _PAIRS)
        self.base = check_number(base, "base")
        self.layout = check_choice(layout, "layout", LAYOUTS)
        self._initial = check_int(initial_cache_len, "initial_cache_len")
        self.scale = check_number(scale, "scale", _NO_SCALING)
        self.ntk_scale = check_number(ntk_scale, "ntk_scale", _NO_SCALING)
        self.rotary_base = self.base if self.ntk_scale == 1.0 else ntk_scaled_base(self.base, self.ntk_scale, head_dim)
        self._cache: dict[tuple, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}  # key -> cos, sin, cos + i sin

    def extra_repr(self) -> str:
        s = f"head_dim={self.head_dim}, base={self.base:g}, layout={self.layout!r}"
        if self.scale != 1.0:
            s += f", scale={self.scale:g}"
        if self.ntk_scale != 1.0:
            s += f", ntk_scale={self.ntk_scale:g} (rotary_base={self.rotary_base:g})"
        return s

    def cache_len(self, device=None, dtype: torch.dtype = torch.float32) -> int:
        """Number of cached positions for this device and angle dtype (0 if none)."""
        entry = self._cache.get((_device_key(device), _angle_dtype(dtype)))
        return 0 if entry is None else entry[0].shape[0]

    def _tables(self, n: int, device, adt: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """cos, sin and cos + i sin of positions ``0 .. n-1`` (at least), the table grown if needed."""
        key = (_device_key(device), adt)
        entry = self._cache.get(key)
        if entry is None or entry[0].shape[0] < n:
            size = max(n, self._initial, 2 * (entry[0].shape[0] if entry is not None else 0))
            with torch.inference_mode(False), torch.no_grad():  # usable by later training steps too
                angle = rope_angles(size, self.head_dim, self.rotary_base, dtype=adt, device=device)
                cos, sin = torch.cos(angle), torch.sin(angle)
                entry = self._cache[key] = (cos, sin, torch.complex(cos, sin))
        return entry

    def forward(self, x: torch.Tensor, positions: PositionsLike = None) -> torch.Tensor:
        check_tensor(x, "x", min_dim=2, floating=True)
        if x.shape[-1] != self.head_dim:
            raise ValueError(f"x.shape[-1] must equal head_dim={self.head_dim}, got shape {tuple(x.shape)}")
        seq, adt = x.shape[-2], _angle_dtype(x.dtype)
        if positions is None and self.scale == 1.0:
            cos, sin, rot = self._tables(seq, x.device, adt)
            return _rotate(x, cos[:seq], sin[:seq], self.layout, rot[:seq])
        pos = _positions_tensor(positions, seq, x.device, adt, x.shape) / self.scale  # m / s
        # Integer positions >= 0 are rows of the table; others (and meta tensors, which hold no values) are computed.
        if pos.device.type != "meta" and pos.numel() and bool((pos == pos.round()).all()) and bool((pos >= 0).all()):
            cos, sin, _ = self._tables(int(pos.max().item()) + 1, x.device, adt)
            idx = pos.long()
            return _rotate(x, cos[idx], sin[idx], self.layout)
        angle = pos[..., None] * rope_frequencies(self.head_dim, self.rotary_base, dtype=adt, device=x.device)
        return _rotate(x, torch.cos(angle), torch.sin(angle), self.layout)


# ---------------------------------------------------------- positions and frequencies given
def _check_frequencies(frequencies, head_dim: int) -> torch.Tensor:
    """A ``(head_dim // 2,)`` finite floating-point tensor. The finiteness check reads the values
    (one device-to-host synchronisation on an accelerator; skipped on ``meta``, which has none)."""
    check_tensor(frequencies, "frequencies")
    if frequencies.shape != (head_dim // 2,):
        raise ValueError(f"frequencies must have shape (head_dim // 2,) = ({head_dim // 2},), got {tuple(frequencies.shape)}")
    if not frequencies.is_floating_point() or (
        frequencies.device.type != "meta" and not bool(torch.isfinite(frequencies).all())
    ):
        raise ValueError("frequencies must be a finite floating-point tensor")
    return frequencies


def _check_positions_dtype(positions: torch.Tensor) -> None:
    """Refuse float16/bfloat16 position tensors: they cannot hold the positions themselves
    (bfloat16 is exact for integers only up to 256, float16 up to 2048; notebook 02 §5)."""
    if positions.dtype in _LOW_PRECISION:
        raise TypeError(
            "positions must be an integer, float32 or float64 tensor (float16/bfloat16 round the "
            f"positions themselves, e.g. bfloat16 holds integers exactly only up to 256), got dtype {positions.dtype}"
        )
    if positions.dtype == torch.bool or positions.is_complex():
        raise TypeError(f"positions must be an integer or real floating-point tensor, got dtype {positions.dtype}")


def _positions_tensor(
    positions: PositionsLike,
    seq: int,
    device: torch.device,
    dtype: torch.dtype,
    x_shape: Optional[Sequence[int]] = None,
) -> torch.Tensor:
    """Positions as a tensor of ``dtype`` whose last dimension has length ``seq`` (``None``:
    ``0 .. seq-1``), checked; with ``x_shape`` (the rotated tensor's shape) also aligned with
    ``x_shape[:-1]`` by :func:`_align_positions`."""
    if positions is None:
        return torch.arange(seq, device=device, dtype=dtype)
    raw = positions if isinstance(positions, torch.Tensor) else torch.as_tensor(positions)
    _check_positions_dtype(raw)  # also a list of bools (a bool tensor once converted)
    if (dtype == torch.float32 and not raw.is_floating_point() and raw.device.type != "meta" and raw.numel()
            and int(raw.abs().max()) > 2**24):
        raise ValueError(
            "positions must be at most 2**24 = 16777216 in absolute value when the angles are float32 (float32 "
            f"holds integers exactly only up to 2**24; larger ones are rounded), got {int(raw.abs().max())}; "
            "rotate float64 input to get float64 angles")
    pos = raw.to(device=device, dtype=dtype)
    if pos.dim() == 0 or pos.shape[-1] != seq:
        raise ValueError(
            "positions must have one entry per sequence position (last dimension = seq = "
            f"{seq}), got shape {tuple(pos.shape)}"
        )
    if pos.device.type != "meta" and not torch.isfinite(pos).all():  # meta tensors hold no values to check
        raise ValueError("positions must be finite")
    return pos if x_shape is None else _align_positions(pos, tuple(x_shape))


def _align_positions(pos: torch.Tensor, x_shape: tuple) -> torch.Tensor:
    """Give ``pos`` (last dimension ``seq``) a shape that broadcasts to ``x_shape[:-1]``.

    * ``(seq,)``: the same positions for every row of ``x``.
    * ``(batch, seq)`` on ``x`` with 3 or more leading dimensions, e.g.
      ``(batch, heads, seq, head_dim)``: batch ``b`` uses ``pos[b]`` for all its heads
      (Hugging Face's convention: ``apply_rotary_pos_emb(..., unsqueeze_dim=1)`` turns
      ``(batch, seq, dim)`` cos/sin into ``(batch, 1, seq, dim)``). Plain right-aligned
      broadcasting would instead pair ``pos[b]`` with *head* ``b``.
    * as many dimensions as ``x_shape[:-1]`` (e.g. ``(batch, 1, seq)``): broadcast as is.

    Anything else (more dimensions than ``x_shape[:-1]``, or between 2 and
    ``len(x_shape) - 1`` exclusive) is ambiguous and raises ``ValueError``, as does a
    shape that does not broadcast to ``x_shape[:-1]``.
    """
    lead = x_shape[:-1]  # (..., seq)
    given = tuple(pos.shape)
    if pos.dim() == 2 and len(lead) > 2:
        pos = pos.reshape(pos.shape[0], *([1] * (len(lead) - 2)), pos.shape[1])  # (batch, 1.., seq)
    elif pos.dim() not in (1, 2, len(lead)):
        raise ValueError(
            f"positions must have shape (seq,), (batch, seq) or {len(lead)} dimensions like x.shape[:-1] = "
            f"{tuple(lead)}, got shape {tuple(pos.shape)}"
        )
    try:
        ok = torch.broadcast_shapes(tuple(pos.shape), tuple(lead)) == tuple(lead)
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(
            f"positions of shape {given} do not match x of shape {tuple(x_shape)}: "
            f"(batch, seq) positions need batch = x.shape[0] = {x_shape[0]} (or 1), and positions "
            f"with the dimensions of x.shape[:-1] must broadcast to {tuple(lead)}"
        )
    return pos
