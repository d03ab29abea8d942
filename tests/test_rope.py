"""Unit and property tests of helpers.rope as taught by notebook 01 (the matrix form).

The element-wise forms (notebook 02) are tested in tests/test_rope_efficient.py.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import helpers
from helpers import apply_rope_matrix, rope_angles, rope_frequencies, rotation_matrix
from pristine import pristine  # tools/pristine.py: the committed copy of a notebook the learner edited

F64 = torch.float64
even_dims = st.integers(1, 32).map(lambda h: 2 * h)
positions_st = st.integers(-5000, 5000)
bases = st.sampled_from([2.0, 100.0, 10000.0, 500000.0])
FAST = settings(max_examples=30, deadline=None)


# ------------------------------------------------------------------ frequencies
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


# --------------------------------------------------------------- rotation matrix
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


# ------------------------------------------------------------ apply_rope_matrix
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


# ----------------------------------------------------------------------- errors
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
        (lambda: apply_rope_matrix(torch.randn(3, 4), positions=[0, 1]), r"positions must have one entry per sequence position \(last dimension = seq = 3\), got shape \(2,\)"),
        (lambda: apply_rope_matrix(torch.randn(4)), r"x must have shape \(\.\.\., seq, head_dim\)"),
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


# ------------------------------------------------------------------ seeding
def test_seed_everything_makes_draws_repeatable():
    g1 = helpers.seed_everything(3)
    a = (torch.randn(4), torch.randn(2, generator=g1))
    g2 = helpers.seed_everything(3)
    b = (torch.randn(4), torch.randn(2, generator=g2))
    torch.testing.assert_close(a, b)
    assert torch.get_num_threads() == 1 and torch.are_deterministic_algorithms_enabled()


@pytest.mark.parametrize("kwargs, match", [({"seed": -1}, "seed must be a non-negative int, got -1"), ({"seed": 0, "num_threads": 0}, "num_threads must be an int >= 1, got 0")])
def test_seed_everything_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        helpers.seed_everything(**kwargs)


# ------------------------------------------- (batch, seq) positions: Hugging Face's convention
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


# ------------------------------------------- the notebook's inline derivation
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


# ------------------------------------------- integer positions past float32's exact range; the matrix form on meta
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


def test_apply_rope_matrix_on_meta_gives_the_shape_and_dtype():
    x = torch.empty(2, 3, 33, 16, device="meta", dtype=torch.bfloat16)
    out = helpers.apply_rope_matrix(x)
    assert out.device.type == "meta" and out.shape == x.shape and out.dtype == x.dtype
