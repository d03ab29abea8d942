"""Unit and property tests of ``helpers.rope``, by unit: frequencies and angles, the rotation matrix and
the matrix form (notebook 01), the element-wise forms, positions, the two layouts, ``RotaryEmbedding``
(notebook 02), the frequencies a module carries (notebook 07), and every error.

References are written here, independent of the code under test: the notes' matrix entry by entry, and
RoPE as GPT-J, Hugging Face Llama and Meta's Llama write it. float16/bfloat16 input is
``tests/test_rope_lowp.py``, the opt-in fused kernel ``tests/test_rope_kernel.py``, every entry point in
every dtype and mode ``tests/test_rope_matrix_entry_points.py``, the quotes of notebook 02 from
``transformers`` ``tests/test_rope_hf_pinned.py``.
"""
from __future__ import annotations

import io
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import helpers
from helpers import rope as R
from helpers.attention import MultiHeadAttention
from helpers.model import TinyTransformer
from helpers.rope import (
    RotaryEmbedding,
    apply_rope,
    apply_rope_complex,
    apply_rope_matrix,
    half_to_interleaved,
    interleaved_to_half,
    interleaved_to_half_index,
    llama3_frequencies,
    rope_angles,
    rope_frequencies,
    rotation_matrix,
)
from pristine import pristine  # tools/pristine.py: the committed copy of a notebook the learner edited

F64 = torch.float64
even_dims = st.integers(1, 32).map(lambda h: 2 * h)
positions_st = st.integers(-5000, 5000)
bases = st.sampled_from([2.0, 100.0, 10000.0, 500000.0])
FAST = settings(max_examples=30, deadline=None)


# --------------------------------------------------------------------------- frequencies and angles
def test_frequencies_match_the_formula():
    d = 64
    theta = rope_frequencies(d, dtype=F64)
    expected = torch.tensor([10000.0 ** (-2 * i / d) for i in range(d // 2)], dtype=F64)
    assert theta.shape == (d // 2,)
    torch.testing.assert_close(theta, expected, rtol=1e-15, atol=0)
    assert theta[0] == 1.0
    assert torch.all(theta[1:] < theta[:-1]), "frequencies must decrease with the pair index"


def test_frequencies_dtype_is_float32_by_default():
    assert rope_frequencies(8).dtype == torch.float32
    with pytest.raises(ValueError, match="dtype must be torch.float32 or torch.float64"):
        rope_frequencies(8, dtype=torch.float16)


def test_frequencies_equal_the_sinusoidal_encoding_frequencies():
    # Vaswani et al. 2017, sec. 3.5: PE(pos, 2i) = sin(pos / 10000^(2i/d)).
    d = 16
    omega = torch.tensor([1 / 10000 ** (2 * i / d) for i in range(d // 2)], dtype=F64)
    torch.testing.assert_close(rope_frequencies(d, dtype=F64), omega)


def test_rope_angles_int_and_tensor_positions():
    a = rope_angles(5, 8, dtype=F64)
    assert a.shape == (5, 4)
    torch.testing.assert_close(a, torch.arange(5, dtype=F64)[:, None] * rope_frequencies(8, dtype=F64))
    torch.testing.assert_close(rope_angles(torch.tensor([2, 3]), 8, dtype=F64), a[2:4])
    with pytest.raises(ValueError, match="positions as an int is a sequence length"):
        rope_angles(-1, 8)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_rope_angles_refuses_low_precision_positions(dtype):
    """bfloat16 arange(3000, 3016) holds only two values near 3000 (spacing 16): rope_angles would
    silently return angles of rounded positions."""
    pos = torch.arange(3000, 3016).to(dtype)
    with pytest.raises(TypeError, match=rf"positions must be an integer, float32 or float64 tensor .*got dtype {dtype}"):
        R.rope_angles(pos, 4)


def test_rope_angles_accepts_exact_positions():
    for pos in (torch.arange(3000, 3016), torch.arange(3000, 3016).float(), torch.arange(3000, 3016).double(),
                list(range(3000, 3016)), 16):
        ang = R.rope_angles(pos, 4)
        assert ang.dtype == torch.float32 and ang.shape == (16, 2)
    torch.testing.assert_close(R.rope_angles(torch.arange(3000, 3016), 4)[:, 0], torch.arange(3000, 3016).float())


def _meta_apply_scaling(freqs, factor=8.0, low=1.0, high=4.0, old_context_len=8192):
    """Meta's Llama 3.1 apply_scaling, one frequency at a time (plain Python)."""
    low_wavelen, high_wavelen = old_context_len / low, old_context_len / high
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < high_wavelen:
            out.append(f)
        elif wavelen > low_wavelen:
            out.append(f / factor)
        else:
            smooth = (old_context_len / wavelen - low) / (high - low)
            out.append((1 - smooth) * f / factor + smooth * f)
    return out


@pytest.mark.parametrize("head_dim, L", [(128, 8192), (64, 2048), (16, 32)])
def test_llama3_frequencies_follow_meta_apply_scaling(head_dim, L):
    plain = [500000.0 ** (-2 * i / head_dim) for i in range(head_dim // 2)]
    ref = torch.tensor(_meta_apply_scaling(plain, old_context_len=L), dtype=torch.float64)
    torch.testing.assert_close(llama3_frequencies(head_dim, original_max_position_embeddings=L, dtype=torch.float64),
                               ref, rtol=1e-12, atol=0)
    ours = llama3_frequencies(head_dim, original_max_position_embeddings=L)
    assert ours.dtype == torch.float32 and ours.shape == (head_dim // 2,)
    assert bool((ours[1:] <= ours[:-1]).all())  # still decreasing: the blend is monotone


# ------------------------------------------------------ the rotation matrix R_m and the matrix form
def _notes_matrix(m: float, d: int, base: float = 10000.0) -> torch.Tensor:
    """R_m written entry by entry from the notes' picture (independent of helpers)."""
    R = torch.zeros(d, d, dtype=F64)
    for i in range(d // 2):
        t = m * base ** (-2 * i / d)
        R[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = torch.tensor(
            [[math.cos(t), -math.sin(t)], [math.sin(t), math.cos(t)]], dtype=F64
        )
    return R


@pytest.mark.parametrize("d", [2, 4, 10, 64])
@pytest.mark.parametrize("m", [0, 1, 3, 250, -7])
def test_rotation_matrix_is_the_notes_matrix(d, m):
    torch.testing.assert_close(rotation_matrix(m, d, dtype=F64), _notes_matrix(m, d), atol=1e-12, rtol=0)


def test_rotation_matrix_float_positions_and_dtype():
    R = rotation_matrix(2.5, 8)
    assert R.dtype == torch.float32 and R.shape == (8, 8)
    torch.testing.assert_close(R.double(), _notes_matrix(2.5, 8), atol=1e-6, rtol=0)
    torch.testing.assert_close(rotation_matrix(torch.tensor(3), 8), rotation_matrix(3, 8))


@FAST
@given(m=positions_st, d=even_dims, base=bases)
def test_rotation_matrix_is_orthogonal_with_det_one(m, d, base):
    R = rotation_matrix(m, d, base, dtype=F64)
    torch.testing.assert_close(R.T @ R, torch.eye(d, dtype=F64), atol=1e-12, rtol=0)
    assert abs(torch.linalg.det(R).item() - 1.0) < 1e-9


@FAST
@given(m=positions_st, n=positions_st, d=even_dims, base=bases)
def test_angles_add_and_transpose_gives_relative_rotation(m, n, d, base):
    Rm, Rn = rotation_matrix(m, d, base, dtype=F64), rotation_matrix(n, d, base, dtype=F64)
    torch.testing.assert_close(Rm @ Rn, rotation_matrix(m + n, d, base, dtype=F64), atol=1e-9, rtol=0)
    torch.testing.assert_close(Rm.T @ Rn, rotation_matrix(n - m, d, base, dtype=F64), atol=1e-9, rtol=0)


@FAST
@given(d=even_dims, seq=st.integers(1, 12), seed=st.integers(0, 2**31 - 1))
def test_apply_rope_matrix_preserves_norms(d, seq, seed):
    x = torch.randn(2, seq, d, dtype=F64, generator=torch.Generator().manual_seed(seed))
    torch.testing.assert_close(apply_rope_matrix(x).norm(dim=-1), x.norm(dim=-1))


def test_apply_rope_matrix_rotates_each_row_by_its_position():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 8, dtype=F64, generator=g)
    pos = [4, 0, 9, 2, 100]
    out = apply_rope_matrix(x, pos)
    for j, p in enumerate(pos):
        torch.testing.assert_close(out[:, j], x[:, j] @ _notes_matrix(p, 8).T)
    torch.testing.assert_close(apply_rope_matrix(x), apply_rope_matrix(x, torch.arange(5)))


def test_apply_rope_matrix_keeps_dtype():
    x = torch.randn(4, 6)
    assert apply_rope_matrix(x).dtype == torch.float32
    assert apply_rope_matrix(x.double()).dtype == F64


@FAST
@given(m=positions_st, n=positions_st, d=even_dims, seed=st.integers(0, 2**31 - 1))
def test_score_depends_only_on_relative_position(m, n, d, seed):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(1, d, dtype=F64, generator=g), torch.randn(1, d, dtype=F64, generator=g)
    score = (apply_rope_matrix(q, [m]) @ apply_rope_matrix(k, [n]).T).item()
    relative = (q @ rotation_matrix(n - m, d, dtype=F64) @ k.T).item()
    assert abs(score - relative) < 1e-9 * (1 + abs(relative))


@FAST
@given(offset=st.integers(0, 100_000), seed=st.integers(0, 2**31 - 1))
def test_score_matrix_is_toeplitz_and_shift_invariant(offset, seed):
    g = torch.Generator().manual_seed(seed)
    d, L = 16, 10
    q, k = torch.randn(d, dtype=F64, generator=g), torch.randn(d, dtype=F64, generator=g)
    pos = torch.arange(L)
    S = apply_rope_matrix(q.expand(L, d), pos) @ apply_rope_matrix(k.expand(L, d), pos).T
    for off in range(-L + 1, L):
        diag = S.diagonal(off)
        torch.testing.assert_close(diag, diag[0].expand_as(diag), atol=1e-10, rtol=0)
    S2 = apply_rope_matrix(q.expand(L, d), pos + offset) @ apply_rope_matrix(k.expand(L, d), pos + offset).T
    torch.testing.assert_close(S2, S, atol=1e-8, rtol=0)


def test_apply_rope_matrix_on_meta_gives_the_shape_and_dtype():
    x = torch.empty(2, 3, 33, 16, device="meta", dtype=torch.bfloat16)
    out = helpers.apply_rope_matrix(x)
    assert out.device.type == "meta" and out.shape == x.shape and out.dtype == x.dtype


NB01 = Path(__file__).resolve().parents[1] / "notebooks" / "01_rope_rotation_matrix.ipynb"


def _tagged_cell(path: Path, tag: str) -> str:
    nb = json.loads(pristine(path).read_text(encoding="utf-8"))
    found = [c for c in nb["cells"] if tag in c.get("metadata", {}).get("tags", [])]
    assert len(found) == 1, f"{path.name} must have exactly one cell tagged {tag!r}"
    return "".join(found[0]["source"])


def test_notebook_inline_rotation_matrix_agrees_with_helpers():
    """Notebook 01 derives R_m inline; helpers must build the same matrix (no drift)."""
    namespace = {"math": math, "torch": torch}
    exec(_tagged_cell(NB01, "inline-rotation-matrix"), namespace)
    inline = namespace["rotation_matrix_inline"]
    for d in [2, 6, 32]:
        for base in [10.0, 10000.0]:
            for m in [0, 1, 5, 77, 1000]:
                torch.testing.assert_close(inline(m, d, base), rotation_matrix(m, d, base, dtype=F64), atol=1e-12, rtol=0)


# ------------------------------------------- the element-wise forms: apply_rope, apply_rope_complex
def randn(*shape, dtype=torch.float64, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def gptj_rope(x: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """GPT-J (transformers/models/gptj): create_sinusoidal_positions + rotate_every_two."""
    seq, dim = x.shape[-2], x.shape[-1]
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64) / dim))
    sinusoid_inp = torch.einsum("i , j -> i j", torch.arange(seq, dtype=torch.int64).float(), inv_freq).float()
    sin, cos = torch.sin(sinusoid_inp), torch.cos(sinusoid_inp)

    def rotate_every_two(t):
        x1 = t[..., ::2]
        x2 = t[..., 1::2]
        t = torch.stack((-x2, x1), dim=-1)
        return t.flatten(-2)

    sin = torch.repeat_interleave(sin, 2, -1)
    cos = torch.repeat_interleave(cos, 2, -1)
    return (x * cos) + (rotate_every_two(x) * sin)


def llama_hf_rope(x: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Hugging Face Llama: LlamaRotaryEmbedding + rotate_half + apply_rotary_pos_emb."""
    seq, dim = x.shape[-2], x.shape[-1]
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    position_ids = torch.arange(seq)[None, :]
    freqs = (inv_freq[None, :, None].float() @ position_ids[:, None, :].float()).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[0], emb.sin()[0]

    def rotate_half(t):
        x1 = t[..., : t.shape[-1] // 2]
        x2 = t[..., t.shape[-1] // 2 :]
        return torch.cat((-x2, x1), dim=-1)

    return (x * cos) + (rotate_half(x) * sin)


def meta_llama_rope(x: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """Meta's llama/model.py: precompute_freqs_cis + apply_rotary_emb."""
    seq, dim = x.shape[-2], x.shape[-1]
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    t = torch.arange(seq, device=freqs.device)
    freqs = torch.outer(t, freqs).float()
    freqs_cis = torch.polar(torch.ones_like(freqs), freqs)
    x_ = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(x_ * freqs_cis).flatten(-2).type_as(x)


SHAPES = [(5, 2), (7, 8), (3, 16, 8), (2, 4, 33, 64)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype,atol", [(torch.float64, 1e-12), (torch.float32, 1e-5)], ids=["f64", "f32"])
def test_all_layouts_agree_with_matrix_form(shape, dtype, atol):
    x = randn(*shape, dtype=dtype)
    ref = apply_rope_matrix(x)
    kw = dict(rtol=0, atol=atol)
    torch.testing.assert_close(apply_rope(x), ref, **kw)
    torch.testing.assert_close(apply_rope(x, layout="interleaved"), ref, **kw)
    torch.testing.assert_close(apply_rope_complex(x), ref, **kw)
    torch.testing.assert_close(apply_rope(interleaved_to_half(x), layout="half"), interleaved_to_half(ref), **kw)
    torch.testing.assert_close(RotaryEmbedding(shape[-1])(x), ref, **kw)
    torch.testing.assert_close(RotaryEmbedding(shape[-1], layout="half")(interleaved_to_half(x)), interleaved_to_half(ref), **kw)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_explicit_positions_and_base(layout):
    x = randn(2, 3, 6, 16)
    pos = [7, -3, 0, 1000, 2, 2]  # any integers, in any order, repeated
    perm = (lambda t: t) if layout == "interleaved" else interleaved_to_half
    ref = perm(apply_rope_matrix(x, pos, base=500.0))
    torch.testing.assert_close(apply_rope(perm(x), pos, base=500.0, layout=layout), ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(apply_rope(perm(x), torch.tensor(pos), base=500.0, layout=layout), ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(RotaryEmbedding(16, 500.0, layout)(perm(x), pos), ref, rtol=0, atol=1e-12)
    frac = [0.5, 1.25, 2.0, 3.75, 10.5, 11.0]  # interpolated positions
    ref = perm(apply_rope_matrix(x, frac))
    torch.testing.assert_close(apply_rope(perm(x), frac, layout=layout), ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(RotaryEmbedding(16, layout=layout)(perm(x), frac), ref, rtol=0, atol=1e-12)
    if layout == "interleaved":
        torch.testing.assert_close(apply_rope_complex(x, frac), ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_non_contiguous_and_offset_inputs(layout):
    base = randn(2, 9, 3, 17)
    x = base[..., 1:].transpose(1, 2)  # (2, 3, 9, 16): odd storage offset, permuted strides
    assert not x.is_contiguous() and x.storage_offset() % 2 == 1
    torch.testing.assert_close(apply_rope(x, layout=layout), apply_rope(x.contiguous(), layout=layout), rtol=0, atol=1e-12)
    y = randn(4, 8, 32)[:, ::2]  # stride-2 rows
    torch.testing.assert_close(apply_rope(y, layout=layout), apply_rope(y.contiguous(), layout=layout), rtol=0, atol=1e-12)


def test_interleaved_fp32_non_viewable_backward():
    x = torch.randn(2, 4, 16, 9)[..., 1:].detach().requires_grad_()  # odd storage offset: not complex-viewable
    assert x.storage_offset() % 2 == 1
    out = R.apply_rope(x, torch.arange(16) + 3)
    x64 = x.detach().double().requires_grad_()
    ref = R.apply_rope_matrix(x64, torch.arange(16) + 3)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    out.sum().backward()
    ref.sum().backward()
    torch.testing.assert_close(x.grad.double(), x64.grad, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_input_untouched_and_output_fresh(layout):
    x = randn(2, 10, 8, dtype=torch.float32)
    before = x.clone()
    out = apply_rope(x, layout=layout)
    assert torch.equal(x, before)
    assert out.data_ptr() != x.data_ptr() and out.shape == x.shape and out.dtype == x.dtype
    out.add_(1.0)  # the memoised cos/sin table must not be reachable through the output
    torch.testing.assert_close(apply_rope(x, layout=layout), out - 1.0)


def test_autograd_flows_through_apply_rope():
    x = randn(3, 8).requires_grad_(True)
    for layout in ("interleaved", "half"):
        assert torch.autograd.gradcheck(lambda t: apply_rope(t, layout=layout), (x,))


@pytest.mark.parametrize("shape", [(1, 2, 64, 16), (2, 8, 40, 128)], ids=str)
def test_gptj_rotate_every_two_matches_interleaved(shape):
    x = randn(*shape, dtype=torch.float32)
    torch.testing.assert_close(apply_rope(x), gptj_rope(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(1, 2, 64, 16), (2, 8, 40, 128)], ids=str)
def test_llama_rotate_half_matches_half(shape):
    x = randn(*shape, dtype=torch.float32)
    torch.testing.assert_close(apply_rope(x, layout="half"), llama_hf_rope(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(RotaryEmbedding(shape[-1], layout="half")(x), llama_hf_rope(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(1, 2, 64, 16), (2, 8, 40, 128)], ids=str)
def test_meta_llama_complex_matches(shape):
    x = randn(*shape, dtype=torch.float32)
    torch.testing.assert_close(apply_rope_complex(x), meta_llama_rope(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(apply_rope(x), meta_llama_rope(x), rtol=1e-5, atol=1e-5)


def test_references_disagree_without_the_permutation():
    x = randn(1, 1, 16, 16, dtype=torch.float32)
    assert (gptj_rope(x) - llama_hf_rope(x)).abs().max() > 0.1
    torch.testing.assert_close(interleaved_to_half(gptj_rope(x)), llama_hf_rope(interleaved_to_half(x)), rtol=1e-5, atol=1e-5)


@settings(max_examples=40, deadline=None)
@given(
    m=st.integers(0, 4000),
    n=st.integers(0, 4000),
    shift=st.integers(-3000, 3000),
    seed=st.integers(0, 2**16),
    layout=st.sampled_from(["interleaved", "half"]),
)
def test_scores_depend_only_on_relative_position(m, n, shift, seed, layout):
    q, k = randn(4, 1, 32, seed=seed), randn(4, 1, 32, seed=seed + 1)  # (heads, 1, d)
    s = (apply_rope(q, [m], layout=layout) * apply_rope(k, [n], layout=layout)).sum(-1)
    s_shift = (apply_rope(q, [m + shift], layout=layout) * apply_rope(k, [n + shift], layout=layout)).sum(-1)
    torch.testing.assert_close(s, s_shift, rtol=0, atol=1e-9)
    # and equals q^T R_{n-m} k: rotate k alone by the offset
    s_rel = (q * apply_rope(k, [n - m], layout=layout)).sum(-1)
    torch.testing.assert_close(s, s_rel, rtol=0, atol=1e-9)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), layout=st.sampled_from(["interleaved", "half"]), d=st.sampled_from([2, 6, 16, 128]))
def test_norms_preserved(seed, layout, d):
    x = randn(3, 20, d, seed=seed)
    out = apply_rope(x, torch.arange(20) * 37, layout=layout)
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1), rtol=1e-12, atol=1e-12)


def test_float64_input_uses_float64_angles():
    # at m ~ 1e7 a float32 angle would be off by ~0.5 rad; float64 input keeps float64 angles
    x = randn(1, 3, 8)
    pos = [10**7, 10**7 + 1, 10**7 + 2]
    theta = rope_frequencies(8, dtype=torch.float64)
    ang = torch.tensor(pos, dtype=torch.float64)[:, None] * theta
    expected = torch.empty_like(x)
    expected[..., 0::2] = x[..., 0::2] * ang.cos() - x[..., 1::2] * ang.sin()
    expected[..., 1::2] = x[..., 1::2] * ang.cos() + x[..., 0::2] * ang.sin()
    torch.testing.assert_close(apply_rope(x, pos), expected, rtol=0, atol=1e-12)


def test_integer_positions_past_2_to_24_are_refused_for_float32_angles():
    x = torch.ones(1, 1, 2)
    helpers.apply_rope(x, torch.tensor([2**24]))  # the largest exact one is accepted
    for pos in (torch.tensor([2**24 + 1]), [-(2**24) - 1]):
        with pytest.raises(ValueError, match=r"positions must be at most 2\*\*24"):
            helpers.apply_rope(x, pos)
    # float64 input rotates with float64 angles, which hold these positions exactly
    out = helpers.apply_rope(x.double(), torch.tensor([2**24 + 1]))
    ref = helpers.apply_rope_matrix(x.double(), torch.tensor([2**24 + 1]))
    torch.testing.assert_close(out, ref)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_frequencies_argument(layout):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 9, 16, generator=g)
    pos = torch.arange(5, 14)
    theta = rope_frequencies(16, 500000.0)
    torch.testing.assert_close(apply_rope(x, pos, layout=layout, frequencies=theta), apply_rope(x, pos, base=500000.0, layout=layout))
    torch.testing.assert_close(apply_rope(x, pos, layout=layout, frequencies=theta / 4),
                               apply_rope(x, pos, base=500000.0, layout=layout, scale=4.0))
    torch.testing.assert_close(apply_rope(x, pos, layout=layout, frequencies=theta, scale=4.0),
                               apply_rope(x, pos, layout=layout, frequencies=theta / 4))
    # against complex multiplication, with arbitrary frequencies
    f = torch.rand(8, generator=g)
    out = apply_rope(x, pos, layout=layout, frequencies=f)
    xi = x if layout == "interleaved" else torch.stack([x[..., :8], x[..., 8:]], -1).flatten(-2)
    z = torch.view_as_complex(xi.double().unflatten(-1, (8, 2)).contiguous()) * torch.polar(
        torch.ones(9, 8, dtype=torch.float64), pos[:, None].double() * f.double())
    ref = torch.view_as_real(z).flatten(-2)
    if layout == "half":
        ref = torch.cat([ref[..., 0::2], ref[..., 1::2]], -1)
    torch.testing.assert_close(out, ref.float(), atol=1e-5, rtol=1e-5)
    # bfloat16 input: angles still float32 (frequencies cast to the angle dtype, not to x's)
    xb = x.to(torch.bfloat16)
    big = torch.tensor([4000])
    fb = rope_frequencies(16, 500000.0)
    ref32 = apply_rope(x[..., :1, :], big, layout=layout, frequencies=fb)
    torch.testing.assert_close(apply_rope(xb[..., :1, :], big, layout=layout, frequencies=fb).float(), ref32, atol=0.05, rtol=0.02)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_given_frequencies_on_meta(layout):
    """Meta tensors hold no values: the finiteness check of `frequencies` must not read them."""
    x = torch.empty(2, 4, 16, 8, device="meta")
    freqs = R.llama3_frequencies(8, factor=8.0, original_max_position_embeddings=16).to("meta")
    for pos in (None, torch.arange(16), torch.arange(16, device="meta")):
        out = R.apply_rope(x, pos, layout=layout, frequencies=freqs)
        assert out.device.type == "meta" and out.shape == x.shape


def test_non_finite_frequencies_are_still_refused():
    bad = R.rope_frequencies(8).clone()
    bad[1] = float("nan")
    with pytest.raises(ValueError, match="frequencies must be a finite floating-point tensor"):
        R.apply_rope(torch.randn(1, 4, 8), frequencies=bad)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_explicit_positions_on_meta(layout):
    x = torch.randn(2, 4, 16, 8, device="meta")
    for pos in (torch.arange(16), torch.arange(16, device="meta"), torch.arange(32).view(2, 16)):
        assert R.apply_rope(x, pos, layout=layout).shape == x.shape
        assert R.apply_rope(x, pos, layout=layout, frequencies=R.rope_frequencies(8)).shape == x.shape
        assert R.RotaryEmbedding(8, layout=layout)(x, pos).shape == x.shape
        assert R.apply_rope_complex(x, pos).shape == x.shape
    mha = MultiHeadAttention(32, 4, rope=True, rope_layout=layout).to("meta")
    assert mha(torch.randn(2, 16, 32, device="meta"), positions=torch.arange(16))[0].shape == (2, 16, 32)


# ----------------------- positions: dtypes, and (batch, seq) positions in Hugging Face's convention
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("call", ["apply_rope", "apply_rope_half", "apply_rope_complex", "RotaryEmbedding", "MHA"])
def test_low_precision_positions_are_refused(call, dtype):
    x = torch.randn(1, 2, 4, 8)
    pos = torch.arange(3000, 3004).to(dtype)
    fn = {"apply_rope": lambda: R.apply_rope(x, pos), "apply_rope_half": lambda: R.apply_rope(x, pos, layout="half"),
          "apply_rope_complex": lambda: R.apply_rope_complex(x, pos),
          "RotaryEmbedding": lambda: R.RotaryEmbedding(8)(x, pos),
          "MHA": lambda: MultiHeadAttention(16, 2, rope=True)(torch.randn(1, 4, 16), positions=pos)}[call]
    with pytest.raises(TypeError, match=rf"positions must be an integer, float32 or float64 tensor .*got dtype {dtype}"):
        fn()


def test_bool_positions_are_refused():
    with pytest.raises(TypeError, match="positions must be an integer or real floating-point tensor, got dtype torch.bool"):
        R.apply_rope(torch.randn(1, 2, 2, 8), torch.tensor([True, False]))


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_positions_per_batch_broadcast(layout):
    x = randn(2, 3, 5, 8)  # (batch, heads, seq, d)
    pos = torch.tensor([[0, 1, 2, 3, 4], [10, 11, 12, 13, 14]])[:, None, :]  # (batch, 1, seq)
    out = apply_rope(x, pos, layout=layout)
    for b in range(2):
        torch.testing.assert_close(out[b], apply_rope(x[b], pos[b, 0], layout=layout))


def _per_example(fn, x, pos):
    """The reference: rotate each example on its own with its own 1-D positions."""
    return torch.stack([fn(x[b], pos[b]) for b in range(x.shape[0])])


def _hf_rotate(x, pos, base=10000.0):
    """Hugging Face Llama's rotate_half + apply_rotary_pos_emb(unsqueeze_dim=1), written out
    from transformers/models/llama/modeling_llama.py (half layout)."""
    d = x.shape[-1]
    inv_freq = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.int64).to(F64) / d))
    freqs = pos.to(F64)[:, :, None] * inv_freq  # (batch, seq, d/2)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().unsqueeze(1), emb.sin().unsqueeze(1)  # unsqueeze_dim=1
    rot = torch.cat((-x[..., d // 2:], x[..., : d // 2]), dim=-1)
    return x * cos + rot * sin


ROTATORS = {
    "apply_rope interleaved": lambda x, p: helpers.apply_rope(x, p),
    "apply_rope half": lambda x, p: helpers.apply_rope(x, p, layout="half"),
    "apply_rope scale=2": lambda x, p: helpers.apply_rope(x, p, scale=2.0),
    "apply_rope ntk_scale=2": lambda x, p: helpers.apply_rope(x, p, ntk_scale=2.0),
    "apply_rope_complex": lambda x, p: helpers.apply_rope_complex(x, p),
    "RotaryEmbedding interleaved": helpers.RotaryEmbedding(8),
    "RotaryEmbedding half": helpers.RotaryEmbedding(8, layout="half"),
    "RotaryEmbedding scale=2": helpers.RotaryEmbedding(8, scale=2.0),
}


@pytest.mark.parametrize("name", list(ROTATORS))
@pytest.mark.parametrize("batch, heads", [(3, 3), (2, 5), (1, 4)])
@pytest.mark.parametrize("kind", ["int", "float"])
def test_batch_seq_positions_rotate_each_example_with_its_own_row(name, batch, heads, kind):
    """(batch, seq) positions on (batch, heads, seq, head_dim): example b uses row b for every
    head. batch == heads is the trap: right-aligned broadcasting pairs row b with head b."""
    fn = ROTATORS[name]
    g = torch.Generator().manual_seed(batch * 10 + heads)
    x = torch.randn(batch, heads, 5, 8, generator=g, dtype=F64)
    pos = torch.randint(0, 60, (batch, 5), generator=g)
    if kind == "float":
        pos = pos / 3.0
    out = fn(x, pos)
    assert out.shape == x.shape
    torch.testing.assert_close(out, _per_example(fn, x, pos), rtol=0, atol=1e-12)
    # the explicit (batch, 1, seq) spelling means the same
    torch.testing.assert_close(fn(x, pos[:, None, :]), out, rtol=0, atol=1e-12)
    if batch > 1:  # and it is not what rotating every example by row 0 gives
        assert (out - fn(x, pos[0])).abs().max() > 1e-3


def test_batch_seq_positions_match_hugging_face_and_the_matrix_form():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(4, 4, 6, 8, generator=g, dtype=F64)  # batch == heads
    pos = torch.randint(0, 100, (4, 6), generator=g)
    torch.testing.assert_close(helpers.apply_rope(x, pos, layout="half"), _hf_rotate(x, pos), rtol=0, atol=1e-12)
    ref = _per_example(lambda xb, pb: apply_rope_matrix(xb, pb), x, pos)
    torch.testing.assert_close(helpers.apply_rope(x, pos), ref, rtol=0, atol=1e-12)
    # (batch, kv_heads, groups, seq, head_dim): 2-D positions still mean (batch, seq)
    x5 = torch.randn(4, 2, 4, 6, 8, generator=g, dtype=F64)
    torch.testing.assert_close(
        helpers.apply_rope(x5, pos), _per_example(lambda xb, pb: apply_rope_matrix(xb, pb), x5, pos), rtol=0, atol=1e-12
    )
    # 3-D input (batch, seq, head_dim): (batch, seq) is already aligned
    x3 = x[:, 0]
    torch.testing.assert_close(helpers.apply_rope(x3, pos), _per_example(lambda xb, pb: apply_rope_matrix(xb, pb), x3, pos), rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: helpers.apply_rope(torch.zeros(2, 3, 5, 8), torch.zeros(3, 5)),
         r"positions of shape \(3, 5\) do not match x of shape \(2, 3, 5, 8\): \(batch, seq\) positions need batch = x.shape\[0\] = 2"),
        (lambda: helpers.apply_rope(torch.zeros(2, 5, 8), torch.zeros(3, 5)),
         r"positions of shape \(3, 5\) do not match x of shape \(2, 5, 8\)"),
        (lambda: helpers.apply_rope(torch.zeros(5, 8), torch.zeros(2, 5)),
         r"positions of shape \(2, 5\) do not match x of shape \(5, 8\)"),
        (lambda: helpers.apply_rope(torch.zeros(2, 3, 4, 5, 8), torch.zeros(2, 3, 5)),
         r"positions must have shape \(seq,\), \(batch, seq\) or 4 dimensions like x.shape\[:-1\] = \(2, 3, 4, 5\), got shape \(2, 3, 5\)"),
        (lambda: helpers.apply_rope_complex(torch.zeros(2, 3, 5, 8), torch.zeros(3, 5)), r"need batch = x.shape\[0\] = 2"),
        (lambda: helpers.RotaryEmbedding(8)(torch.zeros(2, 3, 5, 8), torch.zeros(3, 5, dtype=torch.long)), r"need batch = x.shape\[0\] = 2"),
    ],
)
def test_positions_shape_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ---------------------------------------------------------------------------------- the two layouts
def hf_permute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """transformers/models/llama/convert_llama_weights_to_hf.py"""
    dim1, dim2 = w.shape
    return w.view(n_heads, dim1 // n_heads // 2, 2, dim2).transpose(1, 2).reshape(dim1, dim2)


@pytest.mark.parametrize("d", [2, 4, 8, 64])
def test_layout_permutations(d):
    x = randn(3, 5, d)
    idx = interleaved_to_half_index(d)
    assert sorted(idx.tolist()) == list(range(d))
    assert torch.equal(interleaved_to_half(x), x[..., idx])
    assert torch.equal(half_to_interleaved(interleaved_to_half(x)), x)
    assert torch.equal(interleaved_to_half(half_to_interleaved(x)), x)
    assert idx.tolist() == list(range(0, d, 2)) + list(range(1, d, 2))


def test_hf_converter_permute_is_per_head_interleaved_to_half():
    n_heads, d_head, d_in = 4, 8, 12
    w = randn(n_heads * d_head, d_in)
    rows = torch.cat([h * d_head + interleaved_to_half_index(d_head) for h in range(n_heads)])
    assert torch.equal(hf_permute(w, n_heads), w[rows])


def test_permuted_weights_give_identical_scores():
    torch.manual_seed(0)
    n_heads, d_head, L = 2, 8, 12
    d_model = n_heads * d_head
    W_q, W_k = randn(d_model, d_model, seed=1), randn(d_model, d_model, seed=2)
    x = randn(L, d_model, seed=3)

    def scores(Wq, Wk, layout):
        q = (x @ Wq.T).view(L, n_heads, d_head).transpose(0, 1)
        k = (x @ Wk.T).view(L, n_heads, d_head).transpose(0, 1)
        return apply_rope(q, layout=layout) @ apply_rope(k, layout=layout).transpose(-1, -2)

    s_int = scores(W_q, W_k, "interleaved")
    s_half = scores(hf_permute(W_q, n_heads), hf_permute(W_k, n_heads), "half")
    torch.testing.assert_close(s_int, s_half, rtol=0, atol=1e-10)


# ----------------------------------------------------------- RotaryEmbedding and the memoised table
def test_rotary_embedding_cache_grows_and_never_fails_on_length():
    rope = RotaryEmbedding(8, initial_cache_len=4)
    assert rope.cache_len() == 0
    x = randn(2, 3, 8, dtype=torch.float32)
    rope(x)
    assert rope.cache_len() == 4
    for seq in (5, 17, 300, 5000):
        xs = randn(1, seq, 8, dtype=torch.float32)
        torch.testing.assert_close(rope(xs), apply_rope(xs))
        assert rope.cache_len() >= seq
    n = rope.cache_len()
    torch.testing.assert_close(rope(x[:, :1], positions=[3 * n]), apply_rope(x[:, :1], [3 * n]))
    assert rope.cache_len() > 3 * n
    assert "head_dim=8" in repr(rope) and "layout='interleaved'" in repr(rope)


def test_rotary_embedding_positions_kinds():
    rope = RotaryEmbedding(16)
    x = randn(2, 4, 16, dtype=torch.float32)
    for pos in ([5, 1, 9, 2], [-4, 0, 4, 8], [0.5, 1.5, 2.5, 3.5], torch.tensor([[1, 2, 3, 4], [10, 20, 30, 40]])[:, :]):
        torch.testing.assert_close(rope(x, pos), apply_rope(x, pos))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_rotary_embedding_dtype_follow_through(dtype):
    rope = RotaryEmbedding(8)
    x = randn(3, 10, 8, dtype=torch.float32).to(dtype)
    out = rope(x)
    assert out.dtype == dtype and out.shape == x.shape
    angle_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    assert rope.cache_len(dtype=dtype) >= 10
    ((device, adt), (cos, sin, rot)), = rope._cache.items()  # one table, in the angle dtype, whatever x's dtype
    assert adt == cos.dtype == sin.dtype == angle_dtype and cos.shape[1] == 4 and rot.is_complex()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_rotary_embedding_rotates_exactly_as_apply_rope(dtype, layout):
    """The same numbers, bit for bit, from the table (integer positions are rows of it) as from apply_rope."""
    x = randn(2, 3, 37, 16, dtype=torch.float32).to(dtype)
    g = torch.Generator().manual_seed(0)
    for pos, scale in [(None, 1.0), (None, 2.0), (torch.arange(37) * 3 + 1, 1.0), (torch.arange(37) / 3, 1.0),
                       (torch.randint(0, 3000, (2, 37), generator=g), 1.0), (torch.arange(37) + 5, 4.0)]:
        rope = RotaryEmbedding(16, layout=layout, scale=scale, initial_cache_len=4)
        assert torch.equal(rope(x, pos), apply_rope(x, pos, layout=layout, scale=scale))
    assert torch.equal(RotaryEmbedding(16, layout=layout, ntk_scale=2.0)(x), apply_rope(x, layout=layout, ntk_scale=2.0))


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_rotary_embedding_meta_device_follow_through(layout):
    """The "meta" device stands in for an accelerator: tables must be built where x lives."""
    rope = RotaryEmbedding(8, layout=layout)
    x = torch.empty(2, 6, 8, device="meta")
    out = rope(x)
    assert out.device.type == "meta" and out.shape == x.shape and out.dtype == x.dtype
    assert rope.cache_len(device="meta") >= 6 and rope.cache_len(device="cpu") == 0
    assert apply_rope(x, layout=layout).device.type == "meta"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_cuda_follow_through(layout):
    x = randn(2, 4, 64, 32, dtype=torch.float32)
    rope = RotaryEmbedding(32, layout=layout)
    for dtype in (torch.float32, torch.bfloat16):
        xc = x.to("cuda", dtype)
        out = rope(xc)
        assert out.device.type == "cuda" and out.dtype == dtype
        torch.testing.assert_close(out.cpu().float(), rope(x.to(dtype)).float(), rtol=0, atol=2e-2)
        out2 = apply_rope(xc, layout=layout)
        assert out2.device.type == "cuda" and out2.dtype == dtype
    assert rope.cache_len(device="cuda") >= 64


def test_rotary_cache_key_names_the_device_index(monkeypatch):
    """torch.device("cuda") and cuda:<current> must find the same cache entry."""
    from helpers.rope import _device_key

    assert _device_key(None) == torch.device("cpu") and _device_key("meta") == torch.device("meta")
    assert _device_key("cuda:1") == torch.device("cuda", 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert _device_key("cuda") == torch.device("cuda", 3)
    assert _device_key(torch.device("cuda")) == torch.device("cuda", 3)
    rope = helpers.RotaryEmbedding(8)
    rope._cache[(torch.device("cuda", 3), torch.float32)] = (torch.zeros(7, 4), torch.zeros(7, 4))
    assert rope.cache_len(device="cuda") == 7 and rope.cache_len(device="cuda:3") == 7
    assert rope.cache_len(device="cuda:0") == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_tables_built_under_inference_mode_serve_training(dtype):
    R._cached_tables.cache_clear()
    rot = R.RotaryEmbedding(8, initial_cache_len=4)
    x = torch.randn(1, 2, 37, 8).to(dtype)
    with torch.inference_mode():
        first = (R.apply_rope(x), rot(x), rot(x, torch.arange(37)))
    xg = x.clone().requires_grad_()
    for out, ref in zip((R.apply_rope(xg), rot(xg), rot(xg, torch.arange(37))), first):
        out.float().square().sum().backward()
        torch.testing.assert_close(out.detach(), ref, atol=0, rtol=0)
    assert xg.grad is not None


# ----------------------- frequencies carried by a module: MultiHeadAttention's rope_inv_freq buffer
def _llama3_mha():
    torch.manual_seed(0)
    mha = MultiHeadAttention(32, 4, bias=False, rope=True, rope_base=500000.0, rope_layout="half", num_kv_heads=2)
    mha.rope_inv_freq = R.llama3_frequencies(8, factor=8.0, original_max_position_embeddings=16)
    return mha


def test_rope_inv_freq_survives_state_dict_round_trip():
    mha = _llama3_mha()
    x = torch.randn(1, 100, 32)
    buf = io.BytesIO()
    torch.save(mha.state_dict(), buf)
    buf.seek(0)
    fresh = MultiHeadAttention(32, 4, bias=False, rope=True, rope_base=500000.0, rope_layout="half", num_kv_heads=2)
    assert fresh.rope_inv_freq is None
    fresh.load_state_dict(torch.load(buf))  # strict
    assert fresh.rope_inv_freq.dtype == torch.float32
    torch.testing.assert_close(fresh.rope_inv_freq, mha.rope_inv_freq, atol=0, rtol=0)
    with torch.no_grad():
        torch.testing.assert_close(fresh(x)[0], mha(x)[0], atol=0, rtol=0)
        plain = MultiHeadAttention(32, 4, bias=False, rope=True, rope_base=500000.0, rope_layout="half", num_kv_heads=2)
        plain.load_state_dict({k: v for k, v in mha.state_dict().items() if k != "rope_inv_freq"})
        assert (plain(x)[0] - mha(x)[0]).abs().max() > 1e-3  # the frequencies matter at these positions


def test_rope_inv_freq_stays_float32_under_casts():
    for cast in (lambda m: m.to(torch.bfloat16), lambda m: m.bfloat16(), lambda m: m.half(), lambda m: m.double(),
                 lambda m: m.to("cpu", torch.float16)):
        mha = cast(_llama3_mha())
        assert mha.rope_inv_freq.dtype == torch.float32
        assert mha.linear_q.weight.dtype != torch.float32
        torch.testing.assert_close(mha.rope_inv_freq, _llama3_mha().rope_inv_freq, atol=0, rtol=0)
    sd = _llama3_mha().bfloat16().state_dict()
    assert sd["rope_inv_freq"].dtype == torch.float32 and sd["linear_q.weight"].dtype == torch.bfloat16


def test_old_state_dicts_load_strictly():
    plain = MultiHeadAttention(32, 4, rope=True)
    assert "rope_inv_freq" not in plain.state_dict()  # None: not saved, so old checkpoints still match
    MultiHeadAttention(32, 4, rope=True).load_state_dict(plain.state_dict())
    with pytest.raises(RuntimeError, match=r"size mismatch for rope_inv_freq: expected shape \(head_dim // 2,\) = \(4,\), got \(3,\)"):
        plain.load_state_dict({**plain.state_dict(), "rope_inv_freq": torch.ones(3)})
    with pytest.raises(RuntimeError, match='Missing key.*"rope_inv_freq"'):  # a rescaled module needs its frequencies
        _llama3_mha().load_state_dict(plain.state_dict())


def test_committed_tiny_transformer_checkpoint_loads():
    path = Path(__file__).resolve().parents[1] / "experiments" / "results" / "05_mixed_model.pt"
    if not path.exists():
        pytest.skip("experiments/results/05_mixed_model.pt not present")
    sd = torch.load(path)
    assert not any(k.endswith("rope_inv_freq") for k in sd)
    import importlib.util
    spec = importlib.util.spec_from_file_location("ex05_ckpt", path.parents[1] / "05_head_redundancy_sweeps.py")
    ex05 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex05)
    task, _, test = ex05.mixed_data(0)
    model = TinyTransformer(task.vocab_size, max_len=task.seq_len, seed=0, **ex05.MIXED)
    model.load_state_dict(sd)  # strict: the rope modules' rope_inv_freq is None, so no key is expected
    model.bfloat16()
    assert all(b.attn.rope_inv_freq is None for b in model.blocks)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_mha_with_rope_inv_freq_on_meta(layout):
    mha = MultiHeadAttention(32, 4, rope=True, rope_layout=layout)
    mha.rope_inv_freq = R.llama3_frequencies(8, factor=8.0, original_max_position_embeddings=16)
    mha = mha.to("meta")
    assert mha.rope_inv_freq.device.type == "meta" and mha.rope_inv_freq.dtype == torch.float32
    x = torch.empty(2, 16, 32, device="meta")
    for pos in (None, torch.arange(16)):
        out, _ = mha(x, positions=pos)
        assert out.device.type == "meta" and out.shape == (2, 16, 32)


# ----------------------------------------------------- errors: each names the argument and the rule
@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda: apply_rope(torch.zeros(3, 7)), ValueError, r"head_dim \(x\.shape\[-1\]\) must be even .* got 7"),
        (lambda: apply_rope(torch.zeros(3, 8), layout="rotate_half"), ValueError, r"layout must be one of \('interleaved', 'half'\), got 'rotate_half'"),
        (lambda: apply_rope(torch.zeros(3, 8), base=0.0), ValueError, r"base must be a finite number > 0, got 0\.0"),
        (lambda: apply_rope(torch.zeros(3, 8), base=float("nan")), ValueError, r"base must be a finite number > 0"),
        (lambda: apply_rope(torch.zeros(3, 8), positions=[0, 1]), ValueError,
         r"positions must have one entry per sequence position .*seq = 3.*got shape \(2,\)"),
        (lambda: apply_rope(torch.zeros(3, 8), positions=[0, 1, float("inf")]), ValueError, r"positions must be finite"),
        (lambda: apply_rope(torch.zeros(8)), ValueError, r"x must have at least 2 dimensions, got shape \(8,\)"),
        (lambda: apply_rope(torch.zeros(3, 8, dtype=torch.int64)), TypeError, r"x must be a floating-point tensor, got dtype torch\.int64"),
        (lambda: apply_rope([[0.0, 1.0]]), TypeError, r"x must be a torch\.Tensor, got list"),
        (lambda: apply_rope_complex(torch.zeros(3, 5)), ValueError, r"head_dim \(x\.shape\[-1\]\) must be even .* got 5"),
        (lambda: RotaryEmbedding(7), ValueError, r"head_dim must be even .* got 7"),
        (lambda: RotaryEmbedding(0), ValueError, r"head_dim must be >= 2 .* got 0"),
        (lambda: RotaryEmbedding(8.0), TypeError, r"head_dim must be an int, got float"),
        (lambda: RotaryEmbedding(8, layout="neox"), ValueError, r"layout must be one of .* got 'neox'"),
        (lambda: RotaryEmbedding(8, base=-1.0), ValueError, r"base must be a finite number > 0, got -1\.0"),
        (lambda: RotaryEmbedding(8, initial_cache_len=0), ValueError, r"initial_cache_len must be >= 1, got 0"),
        (lambda: RotaryEmbedding(8)(torch.zeros(3, 16)), ValueError, r"x\.shape\[-1\] must equal head_dim=8, got shape \(3, 16\)"),
        (lambda: RotaryEmbedding(8)(torch.zeros(3, 8), positions=[1, 2]), ValueError, r"positions must have one entry per sequence position"),
        (lambda: interleaved_to_half(torch.zeros(2, 5)), ValueError, r"head_dim \(x\.shape\[-1\]\) must be even .* got 5"),
        (lambda: half_to_interleaved(torch.zeros(2, 3)), ValueError, r"head_dim \(x\.shape\[-1\]\) must be even .* got 3"),
        (lambda: interleaved_to_half_index(9), ValueError, r"head_dim must be even .* got 9"),
    ],
)
def test_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: rope_frequencies(7), r"head_dim must be even .* got 7"),
        (lambda: rope_frequencies(0), r"head_dim must be >= 2 .* got 0"),
        (lambda: rope_frequencies(-4), r"head_dim must be >= 2 .* got -4"),
        (lambda: rope_frequencies(8, base=0.0), r"base must be a finite number > 0, got 0.0"),
        (lambda: rope_frequencies(8, base=-10.0), r"base must be a finite number > 0, got -10.0"),
        (lambda: rope_frequencies(8, base=float("inf")), r"base must be a finite number > 0, got inf"),
        (lambda: rotation_matrix(0, 5), r"head_dim must be even .* got 5"),
        (lambda: rotation_matrix(float("nan"), 4), r"position must be a finite number, got nan"),
        (lambda: rotation_matrix(torch.tensor([1, 2]), 4), r"position must be a single number"),
        (lambda: rotation_matrix(1, 8, base=0), r"base must be a finite number > 0, got 0"),
        (lambda: apply_rope_matrix(torch.randn(3, 7)), r"head_dim \(x.shape\[-1\]\) must be even .* got 7"),
        (lambda: apply_rope_matrix(torch.randn(3, 4), positions=[0, 1]),
         r"positions must have one entry per sequence position \(last dimension = seq = 3\), got shape \(2,\)"),
        (lambda: apply_rope_matrix(torch.randn(4)), r"x must have at least 2 dimensions, got shape \(4,\)"),
        (lambda: apply_rope_matrix(torch.randn(3, 4), base=-1.0), r"base must be a finite number > 0, got -1.0"),
        (lambda: apply_rope_matrix(torch.randn(3, 4), positions=[0, float("inf"), 2]), r"positions must be finite"),
    ],
)
def test_errors_name_the_argument_and_value(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: rope_frequencies(8.0), r"head_dim must be an int, got float"),
        (lambda: rope_frequencies(8, base="big"), r"base must be a number, got str"),
        (lambda: apply_rope_matrix([[1.0, 2.0]]), r"x must be a torch.Tensor, got list"),
        (lambda: apply_rope_matrix(torch.ones(2, 4, dtype=torch.long)), r"x must be a floating-point tensor, got dtype torch.int64"),
    ],
)
def test_type_errors_name_the_argument(call, match):
    with pytest.raises(TypeError, match=match):
        call()


def test_frequency_errors():
    x = torch.randn(2, 4, 8)
    with pytest.raises(ValueError, match=r"frequencies must have shape \(head_dim // 2,\) = \(4,\), got \(8,\)"):
        apply_rope(x, frequencies=torch.ones(8))
    with pytest.raises(TypeError, match="frequencies must be a torch.Tensor, got list"):
        apply_rope(x, frequencies=[1.0] * 4)
    with pytest.raises(ValueError, match="frequencies must be a finite floating-point tensor"):
        apply_rope(x, frequencies=torch.tensor([1.0, float("nan"), 1.0, 1.0]))
    with pytest.raises(ValueError, match="frequencies and ntk_scale cannot be combined"):
        apply_rope(x, frequencies=torch.ones(4), ntk_scale=2.0)
    with pytest.raises(ValueError, match="low_freq_factor must be < high_freq_factor, got 4.0 and 1.0"):
        llama3_frequencies(16, low_freq_factor=4.0, high_freq_factor=1.0)
    with pytest.raises(ValueError, match="original_max_position_embeddings must be >= 1, got 0"):
        llama3_frequencies(16, original_max_position_embeddings=0)
    with pytest.raises(ValueError, match="factor must be a finite number > 0"):
        llama3_frequencies(16, factor=0.0)
    with pytest.raises(ValueError, match="head_dim must be even"):
        llama3_frequencies(15)


# --------------------------- seeding (helpers.seed_everything, which the RoPE notebooks call first)
def test_seed_everything_makes_draws_repeatable():
    torch.set_num_threads(2)  # not the count seed_everything sets (tests/conftest.py pins 1)
    g1 = helpers.seed_everything(3)
    a = (torch.randn(4), torch.randn(2, generator=g1))
    g2 = helpers.seed_everything(3)
    b = (torch.randn(4), torch.randn(2, generator=g2))
    torch.testing.assert_close(a, b)
    assert torch.get_num_threads() == 1 and torch.are_deterministic_algorithms_enabled()


def test_seed_everything_sets_the_eager_flag_without_loading_the_compiler_config():
    """seed_everything sets what torch.use_deterministic_algorithms sets for eager code, without its
    first-call import of torch._inductor.config (0.9 s per process): checked in a fresh process, and
    against torch's own function (both flags where the compiler's configuration is loaded)."""
    import subprocess
    import sys

    code = ("import sys, torch, helpers\n"
            "for det in (True, False, True):\n"
            "    helpers.seed_everything(0, deterministic=det)\n"
            "    print(torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())\n"
            "print('torch._inductor.config' in sys.modules)\n"
            "import torch._inductor.config as c\n"
            "helpers.seed_everything(0, deterministic=False)\n"
            "print(torch.are_deterministic_algorithms_enabled(), c.deterministic)\n"
            "helpers.seed_everything(0)\n"
            "print(torch.are_deterministic_algorithms_enabled(), c.deterministic)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.split("\n")[:6] == ["True False", "False False", "True False", "False", "False False", "True True"], out


@pytest.mark.parametrize("kwargs, match", [({"seed": -1}, "seed must be a non-negative int, got -1"),
                                           ({"seed": 0, "num_threads": 0}, "num_threads must be an int >= 1, got 0")])
def test_seed_everything_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        helpers.seed_everything(**kwargs)


# ---- notebook 02's explorer state and figures, and the benchmark script (smoke tests: speed is never asserted)
def test_rope_cache_state():
    from helpers.viz.rope_efficient import rope_cache_state

    s = rope_cache_state(head_dim=16, log10_base=4.0, positions=(0, 100))
    assert s["cos"].shape == s["sin"].shape == (101, 8) and s["rotated"].shape == (101, 16)
    theta = rope_frequencies(16, dtype=torch.float64).numpy()
    assert abs(s["cos"][37, 3] - math.cos(37 * theta[3])) < 1e-12
    assert abs(s["sin"][37, 3] - math.sin(37 * theta[3])) < 1e-12
    assert s["norm_error"] < 1e-12 and s["pairs"] == (0, 4, 7)
    assert s["cache_bytes_fp32"] == 2 * 101 * 8 * 4 and s["matrix_bytes_fp32"] == 101 * 16 * 16 * 4
    big = rope_cache_state(head_dim=64, positions=(1000, 9000))
    assert len(big["positions"]) <= 256 and big["positions"][0] == 1000
    with pytest.raises(ValueError, match=r"positions must satisfy 0 <= start <= end, got \(5, 1\)"):
        rope_cache_state(positions=(5, 1))
    with pytest.raises(ValueError, match=r"positions must be a \(start, end\) pair"):
        rope_cache_state(positions=(1, 2, 3))
    with pytest.raises(ValueError, match="head_dim must be even"):
        rope_cache_state(head_dim=15)


def test_rope_cache_explorer_updates():
    import matplotlib

    matplotlib.use("Agg")
    from helpers.viz.rope_efficient import plot_angle_precision, plot_rope_benchmark, rope_cache_explorer

    ex = rope_cache_explorer(head_dim=32, positions=(0, 256))
    state = ex.set(head_dim=64, log10_base=5.0, positions=(16, 512))
    assert state["head_dim"] == 64 and abs(state["base"] - 1e5) < 1e-6 and state["start"] == 16
    assert ex.image.value[:4] == b"\x89PNG" and "d = 64" in ex.label.value
    assert len(ex.times_ms) == 2
    import numpy as np

    fig = plot_angle_precision(np.arange(1, 5), {"a": np.ones(4)}, {"a": np.ones(4)}, title="t", marks={"m=2": 2})
    assert len(fig.axes) == 2 and all(ax.get_xscale() == "log" for ax in fig.axes)
    assert "m=2" in [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    fig = plot_rope_benchmark({"seq": {"values": [1, 2], "fixed": "d=8", "ms": {"x": [1.0, 2.0], "memory floor": [0.5, 1.0]}}})
    assert len(fig.axes) == 1
    import matplotlib.pyplot as plt

    plt.close("all")


def test_plot_rope_benchmark_reference_slopes():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from helpers.viz.rope_efficient import plot_rope_benchmark

    sweeps = {"head_dim": {"values": [16, 32, 64], "fixed": "seq=8", "ms": {"matrix": [1.0, 4.0, 16.0], "memory floor": [0.5, 1.0, 2.0]}}}
    fig = plot_rope_benchmark(sweeps, references={"head_dim": [("matrix", 2), ("memory floor", 1)]})
    ax = fig.axes[0]
    assert ax.get_xscale() == ax.get_yscale() == "log"
    dotted = [ln for ln in ax.get_lines() if ln.get_linestyle() == ":"]
    assert len(dotted) == 2
    # slope 2 through the matrix's first point: (16, 1) -> (64, 16)
    assert np.allclose(dotted[0].get_ydata(), [1.0, 4.0, 16.0]) and np.allclose(dotted[1].get_ydata(), [0.5, 1.0, 2.0])
    assert [t.get_text() for t in ax.texts] == ["slope 2", "slope 1"]
    with pytest.raises(ValueError, match=r"references: 'seq' is not a swept parameter \(have \['head_dim'\]\)"):
        plot_rope_benchmark(sweeps, references={"seq": [("matrix", 1)]})
    with pytest.raises(ValueError, match=r"references\['head_dim'\]: 'nope' is not an implementation of that sweep"):
        plot_rope_benchmark(sweeps, references={"head_dim": [("nope", 1)]})
    plt.close("all")


@pytest.mark.parametrize("d", [2, 8, 16])
def test_layout_pairs_and_pairing_figure(d):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from helpers.rope import rotation_matrix
    from helpers.viz.rope_efficient import layout_pairs, plot_pairing

    pairs = layout_pairs(d)
    assert pairs["interleaved"] == [(2 * i, 2 * i + 1) for i in range(d // 2)]
    assert pairs["half"] == [(i, i + d // 2) for i in range(d // 2)]
    # the half pairs are exactly where P R P^T couples two different dimensions (its non-zero off-diagonal entries)
    P = torch.eye(d, dtype=torch.float64)[interleaved_to_half_index(d)]
    R_half = P @ rotation_matrix(1.0, d, dtype=torch.float64) @ P.T
    coupled = {(a, b) for a in range(d) for b in range(a + 1, d) if R_half[a, b] != 0}
    assert coupled == set(pairs["half"])
    fig = plot_pairing(d)
    assert len(fig.axes) == 2
    plt.close("all")


ROOT = Path(__file__).resolve().parents[1]


def test_benchmark_script_runs():
    """Smoke test on a tiny shape: the script checks every implementation, prints the table
    and both ratios. Speed itself is not asserted (tiny shapes measure Python overhead)."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "rope_bench.py"), "--seq", "32", "--heads", "2",
           "--head-dim", "16", "--repeats", "3", "--matrix-repeats", "1", "--threads", "1"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert res.returncode in (0, 1), res.stderr
    for name in ("memory floor x*cos", "apply_rope_matrix", "naive stack (GPT-J)", "complex (Meta Llama)", "apply_rope half"):
        assert name in res.stdout
    assert "apply_rope vs apply_rope_matrix:" in res.stdout and "apply_rope vs memory floor:" in res.stdout
    assert "fused kernel (opt-in):" in res.stdout and "bfloat16 (the same shape)" in res.stdout


def test_benchmark_withholds_its_verdict_on_a_busy_machine(monkeypatch):
    """Under load every ratio to x.clone() counts waits for descheduled workers: no PASS/FAIL then."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "rope_bench.py"
    spec = importlib.util.spec_from_file_location("rope_bench_for_test", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    monkeypatch.setattr(bench.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(bench.os, "getloadavg", lambda: (2.5, 2.0, 2.0))
    assert bench.verdict(True).startswith("NOT JUDGED (load 2.5 on 2 cores")
    monkeypatch.setattr(bench.os, "getloadavg", lambda: (0.4, 0.5, 0.5))
    assert bench.verdict(True) == "PASS" and bench.verdict(False) == "FAIL"


def test_scale_and_ntk_scale_are_checked_on_the_default_path_too():
    """The shortcut for default positions checks ``scale`` and ``ntk_scale`` as the other path does."""
    x = torch.randn(1, 3, 8)
    for kw in (dict(scale=True), dict(ntk_scale=True), dict(scale=0.0), dict(ntk_scale=float("nan"))):
        with pytest.raises((TypeError, ValueError), match="scale"):
            apply_rope(x, **kw)
        with pytest.raises((TypeError, ValueError), match="scale"):
            apply_rope(x, [0, 1, 2], **kw)


def test_a_list_of_bools_as_positions_is_refused_like_a_bool_tensor():
    x = torch.randn(1, 3, 8)
    for call in (lambda p: apply_rope(x, p), lambda p: R.rope_angles(p, 8), lambda p: R.RotaryEmbedding(8)(x, p)):
        for p in ([True, False, True], torch.tensor([True, False, True])):
            with pytest.raises(TypeError, match="positions must be an integer or real floating-point tensor"):
                call(p)


def test_rope_cos_sin_are_the_tables_apply_rope_uses():
    """cos/sin of the angles apply_rope turns float32 x by (default and given positions)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 7, 8, generator=g)
    for pos in (None, torch.randint(0, 500, (2, 7), generator=g), [3, 1, 4, 1, 5, 9, 2]):
        cos, sin = R.rope_cos_sin(x, pos)
        assert cos.dtype == sin.dtype == torch.float32
        xa, xb = x[..., 0::2], x[..., 1::2]
        ref = torch.stack((xa * cos - xb * sin, xb * cos + xa * sin), -1).flatten(-2)
        torch.testing.assert_close(apply_rope(x, pos), ref, rtol=0, atol=1e-6)
