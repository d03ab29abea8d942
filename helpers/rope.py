"""Rotary position embedding (RoPE): the reference implementations of the series.

Taught in ``notebooks/01_rope_rotation_matrix.ipynb`` (the block-diagonal rotation
matrix :math:`R_m`) and ``notebooks/02_rope_efficient.ipynb`` (the element-wise,
half-split and complex forms, the cos/sin cache and the cost of each).

Paper: Su et al., "RoFormer: Enhanced Transformer with Rotary Position Embedding"
(2021), eqs. (13)-(16) and (34).

Conventions used throughout the series
--------------------------------------
* Tensors that are rotated have shape ``(..., seq, head_dim)``; RoPE acts on the
  last dimension, one position per row of the second-to-last dimension.
* ``head_dim`` (written :math:`d`) is even; pair :math:`i` (``0 <= i < d/2``) rotates
  by the angle :math:`m\\theta_i` with :math:`\\theta_i = \\text{base}^{-2i/d}`.
* ``layout="interleaved"`` pairs dimensions ``(2i, 2i+1)`` (the notes, RoFormer,
  GPT-J, Meta's original Llama); ``layout="half"`` pairs ``(i, i + d/2)`` (GPT-NeoX,
  Hugging Face Llama's ``rotate_half``).
* Angles are computed in float32, or float64 when the input is float64, whatever
  the input dtype; the output has the input's dtype.

Stretching RoPE to longer sequences (``notebooks/06_positional_encodings_compared.ipynb``)
-------------------------------------------------------------------------------------------
Two keyword options of :func:`apply_rope` and :class:`RotaryEmbedding`, one line of math each
(both off by default):

* ``scale=s`` -- **position interpolation** (Chen et al. 2023, "Extending Context Window of
  Large Language Models via Positional Interpolation"): position :math:`m` becomes
  :math:`m/s`, so a model trained on length :math:`L` and run on :math:`L' = sL` sees
  positions in :math:`[0, L)` again; every angle :math:`m\\theta_i` is divided by :math:`s`.
* ``ntk_scale=s`` -- **NTK-aware base scaling** (bloc97 2023, "NTK-Aware Scaled RoPE allows
  LLaMA models to have extended (8k+) context size without any fine-tuning", r/LocalLLaMA;
  restated in Peng et al. 2023, YaRN, sec. 3.1): the base becomes :func:`ntk_scaled_base`
  :math:`= \\text{base}\\cdot s^{d/(d-2)}`, i.e. :math:`\\theta'_i = \\theta_i\\,s^{-2i/(d-2)}`:
  the fastest pair is unchanged, the slowest is divided by exactly :math:`s`.
"""
from __future__ import annotations

import functools
import math
from typing import Optional, Sequence, Union

import torch

from . import rope_kernel as _rope_kernel

__all__ = [
    "LAYOUTS",
    "rope_frequencies",
    "rope_angles",
    "rotation_matrix",
    "apply_rope_matrix",
    "apply_rope",
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


# --------------------------------------------------------------------------- checks
def _check_head_dim(head_dim: int, name: str = "head_dim") -> int:
    if isinstance(head_dim, bool) or not isinstance(head_dim, int):
        raise TypeError(f"{name} must be an int, got {type(head_dim).__name__} ({head_dim!r})")
    if head_dim < 2:
        raise ValueError(f"{name} must be >= 2 (RoPE rotates pairs of dimensions), got {head_dim}")
    if head_dim % 2 != 0:
        raise ValueError(
            f"{name} must be even (RoPE rotates pairs of dimensions), got {head_dim}"
        )
    return head_dim


def _check_base(base: float) -> float:
    if isinstance(base, bool) or not isinstance(base, (int, float)):
        raise TypeError(f"base must be a number, got {type(base).__name__} ({base!r})")
    if not math.isfinite(base) or base <= 0:
        raise ValueError(f"base must be a finite number > 0, got {base}")
    return float(base)


def _check_scale(scale: float, name: str) -> float:
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(scale).__name__} ({scale!r})")
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"{name} must be a finite number > 0 (1 = no scaling), got {scale}")
    return float(scale)


def _check_layout(layout: str) -> str:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    return layout


def _check_x(x: torch.Tensor) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() < 2:
        raise ValueError(
            f"x must have shape (..., seq, head_dim) with at least 2 dimensions, got shape {tuple(x.shape)}"
        )
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor, got dtype {x.dtype}")
    _check_head_dim(x.shape[-1], name="head_dim (x.shape[-1])")
    return x


def _angle_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 for float64 input, float32 for everything else (fp16, bf16, fp32)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _positions_tensor(
    positions: PositionsLike,
    seq: int,
    device: torch.device,
    dtype: torch.dtype,
    x_shape: Optional[Sequence[int]] = None,
) -> torch.Tensor:
    """Positions as a tensor of ``dtype`` whose last dimension has length ``seq``.

    With ``x_shape`` (the shape of the rotated tensor) the positions are also aligned
    with ``x_shape[:-1]`` by :func:`_align_positions` (Hugging Face's convention for
    ``(batch, seq)`` positions on ``(batch, heads, seq, head_dim)`` input).
    """
    if positions is None:
        return torch.arange(seq, device=device, dtype=dtype)
    raw = positions if isinstance(positions, torch.Tensor) else torch.as_tensor(positions)
    if isinstance(positions, torch.Tensor):
        _check_positions_dtype(positions)
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
    if x_shape is not None:
        pos = _align_positions(pos, tuple(x_shape))
    return pos


_LOW_PRECISION = (torch.float16, torch.bfloat16)


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
    _check_head_dim(head_dim)
    base = _check_base(base)
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"dtype must be torch.float32 or torch.float64 (angles need it), got {dtype}")
    # Computed in float64, then rounded once: the same numbers whatever the device.
    i = torch.arange(0, head_dim // 2, dtype=torch.float64)
    theta = base ** (-2.0 * i / head_dim)
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
    _check_head_dim(head_dim)
    if isinstance(positions, torch.Tensor):
        _check_positions_dtype(positions)
    if isinstance(positions, int) and not isinstance(positions, bool):
        if positions < 0:
            raise ValueError(f"positions as an int is a sequence length and must be >= 0, got {positions}")
        pos = torch.arange(positions, dtype=dtype, device=device)
    else:
        pos = torch.as_tensor(positions, dtype=dtype, device=device)
        if pos.dim() == 0:
            pos = pos.reshape(1)
    theta = rope_frequencies(head_dim, base, dtype=dtype, device=device)
    return pos[..., None] * theta


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
    base = _check_base(base)
    scale = _check_scale(scale, "scale")
    _check_head_dim(head_dim)
    if head_dim < 4:
        raise ValueError(f"head_dim must be >= 4 for NTK scaling (the exponent d/(d-2) needs d > 2), got {head_dim}")
    return base * scale ** (head_dim / (head_dim - 2))


def _check_frequencies(frequencies, head_dim: int) -> torch.Tensor:
    """Check a ``(head_dim // 2,)`` tensor of per-pair frequencies (type, shape, dtype, finiteness).

    The finiteness check reads the values: on an accelerator that is one device-to-host
    synchronisation per call; on the ``meta`` device, which holds no values, it is skipped
    (as for positions in :func:`_positions_tensor`).
    """
    if not isinstance(frequencies, torch.Tensor):
        raise TypeError(f"frequencies must be a torch.Tensor, got {type(frequencies).__name__}")
    if frequencies.shape != (head_dim // 2,):
        raise ValueError(f"frequencies must have shape (head_dim // 2,) = ({head_dim // 2},), got {tuple(frequencies.shape)}")
    if not frequencies.is_floating_point() or (
        frequencies.device.type != "meta" and not bool(torch.isfinite(frequencies).all())
    ):
        raise ValueError("frequencies must be a finite floating-point tensor")
    return frequencies


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
    _check_head_dim(head_dim)
    base = _check_base(base)
    factor = _check_scale(factor, "factor")
    low = _check_scale(low_freq_factor, "low_freq_factor")
    high = _check_scale(high_freq_factor, "high_freq_factor")
    if not low < high:
        raise ValueError(f"low_freq_factor must be < high_freq_factor, got {low} and {high}")
    L = original_max_position_embeddings
    if isinstance(L, bool) or not isinstance(L, int) or L < 1:
        raise ValueError(f"original_max_position_embeddings must be an int >= 1, got {L!r}")
    theta = rope_frequencies(head_dim, base, dtype=torch.float64)
    wavelen = 2 * math.pi / theta
    gamma = (L / wavelen - low) / (high - low)
    blended = (1 - gamma) * theta / factor + gamma * theta
    out = torch.where(wavelen < L / high, theta, torch.where(wavelen > L / low, theta / factor, blended))
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"dtype must be torch.float32 or torch.float64 (angles need it), got {dtype}")
    return out.to(dtype)


# ------------------------------------------------------------------ the matrix form
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
    _check_head_dim(head_dim)
    base = _check_base(base)
    if isinstance(position, torch.Tensor):
        if position.numel() != 1:
            raise ValueError(f"position must be a single number, got a tensor of shape {tuple(position.shape)}")
        position = position.item()
    if isinstance(position, bool) or not isinstance(position, (int, float)) or not math.isfinite(position):
        raise ValueError(f"position must be a finite number, got {position!r}")
    angle = position * rope_frequencies(head_dim, base, dtype=dtype, device=device)
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
    _check_x(x)
    base = _check_base(base)
    seq, d = x.shape[-2], x.shape[-1]
    adt = _angle_dtype(x.dtype)
    pos = _positions_tensor(positions, seq, x.device, adt)
    if pos.dim() != 1:
        raise ValueError(f"positions must be 1-D (seq,) for apply_rope_matrix, got shape {tuple(pos.shape)}")
    if x.device.type == "meta":  # no values to build R_p from: the output's shape and dtype are x's
        return torch.empty_like(x)
    R = torch.stack([rotation_matrix(float(p), d, base, dtype=adt, device=x.device) for p in pos])
    out = torch.einsum("mij,...mj->...mi", R, x.to(adt))
    return out.to(x.dtype)


# --------------------------------------------------------------- element-wise forms
def _cos_sin(
    seq: int, head_dim: int, base: float, positions: PositionsLike, device, adt: torch.dtype,
    x_shape: Optional[Sequence[int]] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the angles, ``(..., seq, head_dim // 2)``, in the angle dtype
    (positions aligned with ``x_shape[:-1]`` when it is given, see :func:`_align_positions`)."""
    pos = _positions_tensor(positions, seq, device, adt, x_shape)
    angle = pos[..., None] * rope_frequencies(head_dim, base, dtype=adt, device=device)
    return torch.cos(angle), torch.sin(angle)


def _rotate(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str, rot: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """Apply the rotation given per-pair ``cos``/``sin`` (broadcastable to ``(..., seq, d/2)``).

        first  = x_a * cos - x_b * sin
        second = x_b * cos + x_a * sin

    where ``(x_a, x_b)`` are the two members of each pair: ``(x[2i], x[2i+1])`` in the
    interleaved layout, ``(x[i], x[i + d/2])`` in the half layout. ``cos``/``sin`` are in
    the angle dtype (``rot = cos + i sin`` may be passed when it is already at hand).

    * float16/bfloat16 input on the CPU, both layouts: the fused kernel of
      :mod:`helpers.rope_kernel` (one pass: widen each pair to float32, rotate, round once),
      when it is available (:func:`helpers.rope_kernel.status`); otherwise the same numbers
      from PyTorch operators: :func:`_rotate_upcast` (interleaved; Meta's approach: one upcast
      copy to float32, the complex multiply in place, one downcast) or the half-layout
      formula below on a float32 copy, rounded once;
    * half layout, float32/float64: ``x * (cos, cos)``, then one fused multiply-add
      (``addcmul_``) on each half of that fresh output, in ``x.dtype``;
    * interleaved float32/float64 input that cannot be viewed as complex: the stride-2
      halves, ``torch.mul(..., out=)`` into one preallocated output when no gradient is
      needed, else the same products out of place (``out=`` does not support autograd),
      stacked back into pairs. Both give the same numbers.
    """
    d = x.shape[-1]
    if x.dtype in _LOW_PRECISION:
        cos32, sin32 = cos.float(), sin.float()
        fused = _rope_kernel.try_fused(x, cos32, sin32, layout)
        if fused is not None:
            return fused
        if layout == "interleaved":
            return _rotate_upcast(x, torch.complex(cos32, sin32) if rot is None else rot)
        return _rotate(x.float(), cos32, sin32, "half").to(x.dtype)  # float32 arithmetic, one rounding
    if cos.dtype != x.dtype:
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    if layout == "half":
        # Each half is a run of d/2 contiguous numbers: one full-width multiply by
        # (cos, cos), then one fused multiply-add per half (in place on a fresh tensor:
        # autograd-safe, since the product saves its inputs, not its output).
        h = d // 2
        out = x * torch.cat([cos, cos], dim=-1)
        out[..., :h].addcmul_(x[..., h:], sin, value=-1.0)
        out[..., h:].addcmul_(x[..., :h], sin)
        return out
    xa, xb = x[..., 0::2], x[..., 1::2]
    if torch.is_grad_enabled() and (x.requires_grad or cos.requires_grad or sin.requires_grad):
        oa = xa * cos
        oa.addcmul_(xb, sin, value=-1.0)
        ob = xb * cos
        ob.addcmul_(xa, sin)
        return torch.stack((oa, ob), dim=-1).flatten(-2)
    shape = torch.broadcast_shapes(x.shape[:-1] + (d // 2,), cos.shape)
    out = torch.empty(shape[:-1] + (d,), dtype=x.dtype, device=x.device)
    oa, ob = out[..., 0::2], out[..., 1::2]
    torch.mul(xa, cos, out=oa)
    oa.addcmul_(xb, sin, value=-1.0)
    torch.mul(xb, cos, out=ob)
    ob.addcmul_(xa, sin)
    return out


def _rotate_upcast(x: torch.Tensor, rot: torch.Tensor) -> torch.Tensor:
    """Interleaved RoPE of float16/bfloat16 ``x`` computed in float32, as Meta's Llama does
    (``view_as_complex(xq.float()) * freqs_cis``, then ``type_as``): one upcast copy of ``x``
    (which is complex-viewable), the complex multiply by ``rot`` (``(..., seq, d/2)``,
    complex64) in place on that copy, one rounding back to ``x.dtype``. Out of place with
    respect to ``x``, so autograd-safe; one rounding per output instead of one per product."""
    xf = x.to(torch.float32, memory_format=torch.contiguous_format, copy=True)
    z = torch.view_as_complex(xf.unflatten(-1, (x.shape[-1] // 2, 2)))
    rot = rot.to(device=x.device, dtype=torch.complex64)
    if rot.requires_grad or torch.broadcast_shapes(rot.shape, z.shape) != z.shape:
        z = z * rot
    else:
        z.mul_(rot)
    return torch.view_as_real(z).flatten(-2).to(x.dtype)


@functools.lru_cache(maxsize=16)
def _cached_tables(
    seq: int, head_dim: int, base: float, device: str, adt: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """cos, sin ``(seq, d/2)`` and ``cos + i sin`` for positions ``0 .. seq-1`` (memoised).

    Meta's Llama (``freqs_cis``) and vLLM (``cos_sin_cache``) keep such a table instead of
    recomputing ``seq * d/2`` cosines and sines; Hugging Face ``transformers`` 5.24 keeps none
    and recomputes cos/sin once per forward, shared by all layers (appendix notebook 02a §2 and notebook 07 §6).
    """
    with torch.inference_mode(False), torch.no_grad():  # a table built under inference_mode must serve training later
        cos, sin = _cos_sin(seq, head_dim, base, None, torch.device(device), adt)
        return cos, sin, torch.complex(cos, sin)


def _complex_viewable(x: torch.Tensor) -> bool:
    """Can ``x.unflatten(-1, (d/2, 2))`` be viewed as complex without a copy?"""
    return (
        x.dtype in (torch.float32, torch.float64)
        and x.stride(-1) == 1
        and x.storage_offset() % 2 == 0
        and all(st % 2 == 0 for st, n in zip(x.stride()[:-1], x.shape[:-1]) if n > 1)
    )


def _rotate_complex(x: torch.Tensor, rot: torch.Tensor) -> torch.Tensor:
    """``x`` (complex-viewable, interleaved pairs) times ``rot`` = ``cos + i sin`` (``(..., seq, d/2)``):
    one vectorised pass that reads ``x`` once and writes the result once."""
    z = torch.view_as_complex(x.unflatten(-1, (x.shape[-1] // 2, 2)))
    return torch.view_as_real(z * rot).flatten(-2)


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
    r"""Rotate ``x`` by RoPE with the element-wise form (RoFormer eq. 34).

    For ``layout="interleaved"`` (pairs ``2i, 2i+1``):

    .. math::
        R_m x = x \odot (\cos m\theta_0, \cos m\theta_0, \cos m\theta_1, \dots)
              + (-x_1, x_0, -x_3, x_2, \dots) \odot (\sin m\theta_0, \sin m\theta_0, \dots)

    (:math:`\odot`: element-wise product; RoFormer eq. 34 writes it :math:`\otimes`.)

    For ``layout="half"`` (pairs ``i, i+d/2``) the same rotation acts on
    ``interleaved_to_half``-permuted coordinates:
    ``x * cos + rotate_half(x) * sin`` with ``rotate_half(x) = cat(-x[d/2:], x[:d/2])``.

    How it is made fast in eager PyTorch (``notebooks/appendix/02a_rope_cost_on_a_cpu.ipynb``
    measures each step): the cos/sin table for positions ``0 .. seq-1`` is memoised; for float32
    and float64 input in the interleaved layout the pairs are viewed (no copy) as complex
    numbers and multiplied by :math:`e^{im\theta_i}` in a single vectorised pass, which
    computes exactly ``(a cos - b sin, b cos + a sin)``. float16/bfloat16 input (both
    layouts) is rotated in float32 and rounded once, as Meta's Llama does it; on the CPU by
    the one-pass C kernel of :mod:`helpers.rope_kernel` (widen each pair, rotate, round,
    write: close to the time of ``x.clone()``, ``benchmarks/rope_bench.py``), elsewhere or
    without a C compiler by PyTorch operators that give the same numbers (one upcast copy,
    the complex multiply in place, one rounding back; several times slower, since every
    operator is a pass over memory). The float32/float64 half layout multiplies by
    ``(cos, cos)`` and adds each half's ``sin`` term with ``addcmul_`` on that fresh output.
    Every path is out of place with respect to ``x`` and supports autograd (a
    float32/float64 tensor that cannot be viewed as complex uses ``torch.mul(..., out=)``
    only when no gradient is needed).

    Args:
        x: ``(..., seq, head_dim)``, e.g. ``(batch, heads, seq, head_dim)``.
        positions: ``None`` (``0 .. seq-1``), or positions (integers, or floats for
            interpolated positions) of shape

            * ``(seq,)``: the same positions for every row;
            * ``(batch, seq)``: one row of positions per example. On input with three or
              more leading dimensions, e.g. ``(batch, heads, seq, head_dim)``, it follows
              Hugging Face's convention (``apply_rotary_pos_emb(..., unsqueeze_dim=1)``):
              example ``b`` uses ``positions[b]`` for all of its heads, as if it were
              ``positions[:, None, :]``. (Right-aligned broadcasting would pair
              ``positions[b]`` with head ``b``: a silent error when batch == heads.)
              ``batch`` must equal ``x.shape[0]`` (or be 1);
            * as many dimensions as ``x.shape[:-1]``, broadcastable to it, e.g.
              ``(batch, 1, seq)``.

            Other shapes raise ``ValueError``.
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
        Tensor of the shape and dtype of ``x``. Angles are computed in float32 (float64
        for float64 input). float16/bfloat16 input is rotated in float32 and rounded once
        (both layouts; Hugging Face instead casts cos/sin to ``x.dtype`` and rounds after
        every operator, which can differ by a few units in the last place).
    """
    _check_x(x)
    base = _check_base(base)
    _check_layout(layout)
    seq, d = x.shape[-2], x.shape[-1]
    adt = _angle_dtype(x.dtype)
    if ntk_scale != 1.0:
        if frequencies is not None:
            raise ValueError("frequencies and ntk_scale cannot be combined (both set the frequencies); pass one")
        base = ntk_scaled_base(base, _check_scale(ntk_scale, "ntk_scale"), d)  # NTK-aware: base' = base * s^(d/(d-2))
    if frequencies is not None:  # given per-pair frequencies (e.g. Llama 3.1's rescaled ones): angles m * theta_i
        theta = _check_frequencies(frequencies, d).to(device=x.device, dtype=adt)
        pos = _positions_tensor(positions, seq, x.device, adt, x.shape)  # (batch, seq): per example, as below
        if scale != 1.0:
            pos = pos / _check_scale(scale, "scale")
        angle = pos[..., None] * theta
        cos, sin = torch.cos(angle), torch.sin(angle)
        if layout == "interleaved" and _complex_viewable(x):
            return _rotate_complex(x, torch.complex(cos, sin))
        return _rotate(x, cos, sin, layout)
    if scale != 1.0:
        positions = _positions_tensor(positions, seq, x.device, adt) / _check_scale(scale, "scale")  # PI: m -> m/s
    if positions is None:
        cos, sin, rot = _cached_tables(seq, d, base, str(x.device), adt)
    else:
        cos, sin = _cos_sin(seq, d, base, positions, x.device, adt, x.shape)
        rot = None
    if layout == "interleaved" and _complex_viewable(x):
        if rot is None:
            rot = torch.complex(cos, sin)
        return _rotate_complex(x, rot)
    return _rotate(x, cos, sin, layout, rot)


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
    _check_x(x)
    base = _check_base(base)
    adt = _angle_dtype(x.dtype)
    seq, d = x.shape[-2], x.shape[-1]
    pos = _positions_tensor(positions, seq, x.device, adt, x.shape)
    angle = pos[..., None] * rope_frequencies(d, base, dtype=adt, device=x.device)
    rot = torch.polar(torch.ones_like(angle), angle)  # e^{i m theta_i}
    z = torch.view_as_complex(x.to(adt).reshape(*x.shape[:-1], d // 2, 2).contiguous())
    return torch.view_as_real(z * rot).flatten(-2).to(x.dtype)


# ------------------------------------------------------------------ layout permutation
def interleaved_to_half_index(head_dim: int) -> torch.Tensor:
    """The index ``perm`` with ``x_half = x_interleaved[..., perm]``: ``(0, 2, 4, ..., 1, 3, 5, ...)``.

    Pair ``i`` sits at ``(2i, 2i+1)`` in the interleaved layout and at ``(i, i + d/2)``
    in the half layout, so the half layout lists the first members of all pairs, then
    the second members.
    """
    _check_head_dim(head_dim)
    return torch.cat([torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)])


def interleaved_to_half(x: torch.Tensor) -> torch.Tensor:
    """Permute the last dimension from the interleaved layout to the half layout.

    ``apply_rope(interleaved_to_half(x), layout="half") ==
    interleaved_to_half(apply_rope(x, layout="interleaved"))``.
    """
    _check_head_dim(x.shape[-1], name="head_dim (x.shape[-1])")
    return torch.cat([x[..., 0::2], x[..., 1::2]], dim=-1)


def half_to_interleaved(x: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`interleaved_to_half`: ``(a_0..a_{d/2-1}, b_0..) -> (a_0, b_0, a_1, b_1, ...)``."""
    _check_head_dim(x.shape[-1], name="head_dim (x.shape[-1])")
    d = x.shape[-1]
    return torch.stack([x[..., : d // 2], x[..., d // 2 :]], dim=-1).flatten(-2)


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
    r"""RoPE with a cached cos/sin table, as Meta's Llama (``freqs_cis``) and vLLM (``cos_sin_cache``)
    keep one (Hugging Face ``transformers`` 5.24 recomputes cos/sin at every forward instead).

    ``forward(x, positions=None)`` rotates ``x`` of shape ``(..., seq, head_dim)``.
    The cache holds cos/sin for positions ``0 .. n-1`` in the angle dtype (float32, or
    float64 after ``.double()``-style use with float64 input); it grows (doubling) when a
    longer sequence or a larger integer position arrives, so it never fails on length.
    It follows the input's device; the cache is keyed by the device with its index
    (``"cuda"`` means the current CUDA device, ``cuda:0`` usually), so
    ``cache_len(device="cuda")`` and ``cache_len(device="cuda:0")`` agree.
    Non-integer positions (e.g. interpolated) are computed directly instead of being
    looked up. ``positions`` takes the shapes of :func:`apply_rope`: ``(seq,)``,
    ``(batch, seq)`` (Hugging Face's convention: on ``(batch, heads, seq, head_dim)``
    input example ``b`` uses ``positions[b]`` for all heads), or the dimensions of
    ``x.shape[:-1]``.

    Args:
        head_dim: even, >= 2.
        base: frequency base, > 0.
        layout: ``"interleaved"`` or ``"half"``.
        initial_cache_len: how many positions to precompute.
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
        self.head_dim = _check_head_dim(head_dim)
        self.base = _check_base(base)
        self.layout = _check_layout(layout)
        if isinstance(initial_cache_len, bool) or not isinstance(initial_cache_len, int) or initial_cache_len < 1:
            raise ValueError(f"initial_cache_len must be an int >= 1, got {initial_cache_len!r}")
        self.scale = _check_scale(scale, "scale")
        self.ntk_scale = _check_scale(ntk_scale, "ntk_scale")
        self.rotary_base = self.base if self.ntk_scale == 1.0 else ntk_scaled_base(self.base, self.ntk_scale, head_dim)
        self._cache: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        self._complex_cache: dict[tuple, torch.Tensor] = {}  # cos + i sin, for the one-pass path
        self._initial = initial_cache_len

    def extra_repr(self) -> str:
        s = f"head_dim={self.head_dim}, base={self.base:g}, layout={self.layout!r}"
        if self.scale != 1.0:
            s += f", scale={self.scale:g}"
        if self.ntk_scale != 1.0:
            s += f", ntk_scale={self.ntk_scale:g} (rotary_base={self.rotary_base:g})"
        return s

    def cache_len(self, device=None, dtype: torch.dtype = torch.float32) -> int:
        """Number of cached positions for this device and angle dtype (0 if none)."""
        key = (_device_key(device), _angle_dtype(dtype))
        entry = self._cache.get(key)
        return 0 if entry is None else entry[0].shape[0]

    def cos_sin(self, n: int, device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin for positions ``0 .. n-1``, ``(n, head_dim // 2)``, in ``dtype``."""
        adt = _angle_dtype(dtype)
        key = (_device_key(device), adt)
        entry = self._cache.get(key)
        if entry is None or entry[0].shape[0] < n:
            size = max(n, self._initial, 2 * (entry[0].shape[0] if entry is not None else 0))
            with torch.inference_mode(False), torch.no_grad():  # usable by later training steps too
                angle = rope_angles(size, self.head_dim, self.rotary_base, dtype=adt, device=device)
                entry = (torch.cos(angle), torch.sin(angle))
            self._cache[key] = entry
        cos, sin = entry[0][:n], entry[1][:n]
        return cos.to(dtype), sin.to(dtype)

    def _complex_table(self, n: int, device, adt: torch.dtype) -> torch.Tensor:
        """``cos + i sin`` for positions ``0 .. n-1`` (``(n, head_dim // 2)``), cached beside cos/sin."""
        self.cos_sin(n, device, adt)  # grows the cos/sin cache if needed
        key = (_device_key(device), adt)
        cos, sin = self._cache[key]
        rot = self._complex_cache.get(key)
        if rot is None or rot.shape[0] != cos.shape[0]:
            with torch.inference_mode(False), torch.no_grad():
                rot = torch.complex(cos, sin)
            self._complex_cache[key] = rot
        return rot[:n]

    def forward(self, x: torch.Tensor, positions: PositionsLike = None) -> torch.Tensor:
        _check_x(x)
        if x.shape[-1] != self.head_dim:
            raise ValueError(
                f"x.shape[-1] must equal head_dim={self.head_dim}, got shape {tuple(x.shape)}"
            )
        seq = x.shape[-2]
        if self.scale != 1.0:  # position interpolation: m -> m / s (then computed directly)
            positions = _positions_tensor(positions, seq, x.device, _angle_dtype(x.dtype), x.shape) / self.scale
        if positions is None:
            if self.layout == "interleaved" and _complex_viewable(x):  # float32/float64: one pass
                return _rotate_complex(x, self._complex_table(seq, x.device, x.dtype))
            adt = _angle_dtype(x.dtype)
            cos, sin = self.cos_sin(seq, x.device, adt)
            rot = self._complex_table(seq, x.device, adt) if x.dtype in _LOW_PRECISION else None
            return _rotate(x, cos, sin, self.layout, rot)
        adt = _angle_dtype(x.dtype)
        pos = _positions_tensor(positions, seq, x.device, adt, x.shape)
        # Integer positions >= 0 are looked up in the table; others (and meta tensors, which hold no values) are computed.
        is_int = pos.device.type != "meta" and bool((pos == pos.round()).all()) and bool((pos >= 0).all())
        if is_int:
            n = int(pos.max().item()) + 1 if pos.numel() else 0
            cos_t, sin_t = self.cos_sin(n, x.device, adt)
            idx = pos.long()
            cos, sin = cos_t[idx], sin_t[idx]
        else:
            cos, sin = _cos_sin(seq, self.head_dim, self.rotary_base, pos, x.device, adt)
        return _rotate(x, cos, sin, self.layout)
