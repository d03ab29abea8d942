"""Tests of notebook 06's numerics: positional schemes of TinyTransformer, the RoPE stretching options
of helpers.rope (position interpolation, NTK-aware base), and helpers.positional.

References are independent of the code under test: the sinusoidal formula of Vaswani et al. written
entry by entry with ``math``, RoPE written as complex multiplication with ``torch.polar``, and the
NTK formula base * s^(d/(d-2)) written out.
"""
from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import IGNORE_INDEX, LookbackTask, PairRecallTask, TinyTransformer, evaluate, sinusoidal_encoding, train
from helpers.positional import (
    ShiftLengthGrid,
    accuracy_by_position,
    init_position_table_,
    interpolated_positions,
    position_similarity,
    rope_attention_modules,
    shift_angles,
    shift_length_grid,
    use_rope_base,
)
from helpers.rope import RotaryEmbedding, apply_rope, ntk_scaled_base, rope_frequencies

F64 = torch.float64
FAST = settings(max_examples=25, deadline=None)


def _rope_reference(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """Interleaved RoPE as complex multiplication z_i * exp(i m theta_i), theta_i = base^(-2i/d) (float64)."""
    d = x.shape[-1]
    theta = torch.tensor([base ** (-2 * i / d) for i in range(d // 2)], dtype=F64)
    angle = positions.to(F64)[:, None] * theta
    z = torch.complex(x[..., 0::2].to(F64), x[..., 1::2].to(F64)) * torch.polar(torch.ones_like(angle), angle)
    return torch.stack([z.real, z.imag], dim=-1).flatten(-2)


# ----------------------------------------------------------------- sinusoidal table
@pytest.mark.parametrize("d", [2, 8, 32])
def test_sinusoidal_table_matches_the_paper_formula(d):
    pe = sinusoidal_encoding(50, d).double()
    for pos in [0, 1, 7, 49]:
        for i in range(d // 2):
            w = 1 / 10000 ** (2 * i / d)
            assert pe[pos, 2 * i].item() == pytest.approx(math.sin(pos * w), abs=1e-7)
            assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(pos * w), abs=1e-7)
    # tensor positions (e.g. shifted) give the rows of the longer table
    torch.testing.assert_close(sinusoidal_encoding(torch.arange(10, 20), d), sinusoidal_encoding(20, d)[10:])


# ------------------------------------------------------------------- shift invariance
@FAST
@given(offset=st.integers(1, 100_000), layers=st.integers(1, 3), seed=st.integers(0, 50))
def test_rope_only_model_is_exactly_shift_invariant(offset, layers, seed):
    model = TinyTransformer(11, 16, 2, layers, max_len=8, pos="rope", seed=seed).double().eval()
    x = torch.randint(0, 11, (3, 9), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        ref = model(x)
        shifted = model(x, offset=offset)
        explicit = model(x, positions=torch.arange(9) + offset)
    torch.testing.assert_close(shifted, ref, atol=1e-9, rtol=0)
    torch.testing.assert_close(explicit, ref, atol=1e-9, rtol=0)
    # the attention weights too, layer by layer
    model(x)
    w0 = [w.clone() for w in model.attention_weights]
    model(x, offset=offset)
    for a, b in zip(w0, model.attention_weights):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0)


def test_nope_is_shift_invariant_and_additive_schemes_are_not():
    x = torch.randint(0, 11, (4, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        none = TinyTransformer(11, 16, 2, 2, max_len=64, pos="none", seed=0).eval()
        assert torch.equal(none(x, offset=37), none(x))
        for pos in ["sinusoidal", "learned"]:
            m = TinyTransformer(11, 16, 2, 2, max_len=64, pos=pos, seed=0).eval()
            assert (m(x, offset=5) - m(x)).abs().max() > 1e-2, pos


def test_one_layer_nope_output_ignores_the_order_of_the_prefix():
    # why NoPE cannot look back k steps with one layer (notebook 06, sec. 2)
    model = TinyTransformer(8, 16, 2, 1, max_len=16, pos="none", seed=3).eval()
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 8, (5, 12), generator=g)
    y = x.clone()
    y[:, :11] = x[:, torch.randperm(11, generator=g)]
    with torch.no_grad():
        torch.testing.assert_close(model(x)[:, 11], model(y)[:, 11], atol=1e-5, rtol=0)


# ------------------------------------------------------------------- learned guard
def test_learned_table_guards_its_length():
    model = TinyTransformer(8, 16, 2, 1, max_len=16, pos="learned", seed=0)
    model(torch.zeros(2, 16, dtype=torch.long))  # exactly max_len is fine
    with pytest.raises(ValueError, match=r"max_len=16\); got positions in \[0, 16\] \(seq=17\)"):
        model(torch.zeros(2, 17, dtype=torch.long))
    with pytest.raises(ValueError, match=r"max_len=16\); got positions in \[1, 16\]"):
        model(torch.zeros(2, 16, dtype=torch.long), offset=1)
    with pytest.raises(ValueError, match="needs integer positions"):
        model(torch.zeros(1, 4, dtype=torch.long), positions=torch.tensor([0.0, 0.5, 1.0, 1.5]))
    with pytest.raises(ValueError, match="max_len"):
        evaluate(model, LookbackTask(seq_len=32).make(4, seed=0))
    # other schemes run beyond max_len
    for pos in ["none", "sinusoidal", "rope"]:
        TinyTransformer(8, 16, 2, 1, max_len=16, pos=pos, seed=0)(torch.zeros(1, 40, dtype=torch.long))


def test_untrained_rows_of_a_learned_table_stay_at_their_initialisation():
    task = LookbackTask(num_symbols=8, seq_len=8, k=2)
    model = TinyTransformer(8, 16, 2, 1, max_len=32, pos="learned", seed=0)
    before = model.pos_emb.weight.detach().clone()
    train(model, task, steps=5, n_train=64, n_val=0, seed=0)
    assert torch.equal(model.pos_emb.weight[8:], before[8:])
    assert not torch.equal(model.pos_emb.weight[:8], before[:8])


# ------------------------------------------------------- RoPE stretching options
@FAST
@given(half=st.integers(2, 32), s=st.floats(1.01, 64.0), base=st.sampled_from([100.0, 10000.0, 500000.0]))
def test_ntk_scaled_base_changes_theta_as_the_formula_says(half, s, base):
    d = 2 * half
    new_base = ntk_scaled_base(base, s, d)
    assert new_base == pytest.approx(base * s ** (d / (d - 2)), rel=1e-12)
    theta = rope_frequencies(d, base, dtype=F64)
    theta_ntk = rope_frequencies(d, new_base, dtype=F64)
    i = torch.arange(d // 2, dtype=F64)
    torch.testing.assert_close(theta_ntk, theta * s ** (-2 * i / (d - 2)), rtol=1e-10, atol=0)
    assert theta_ntk[0] == theta[0] == 1.0  # the fastest pair is unchanged
    assert theta_ntk[-1].item() == pytest.approx(theta[-1].item() / s, rel=1e-10)  # the slowest is interpolated
    assert ntk_scaled_base(base, 1.0, d) == base


@FAST
@given(s=st.floats(0.25, 16.0), seq=st.integers(1, 40), layout=st.sampled_from(["interleaved", "half"]))
def test_position_interpolation_divides_every_angle(s, seq, layout):
    x = torch.randn(2, 3, seq, 8, dtype=F64, generator=torch.Generator().manual_seed(seq))
    out = apply_rope(x, scale=s, layout=layout)
    torch.testing.assert_close(out, apply_rope(x, positions=torch.arange(seq, dtype=F64) / s, layout=layout))
    if layout == "interleaved":
        torch.testing.assert_close(out, _rope_reference(x, torch.arange(seq, dtype=F64) / s, 10000.0))
    # with explicit positions: (p / s)
    p = torch.arange(seq, dtype=F64) * 3 + 5
    torch.testing.assert_close(apply_rope(x, p, scale=s, layout=layout), apply_rope(x, p / s, layout=layout))


def test_ntk_option_of_apply_rope_and_float32():
    x = torch.randn(1, 2, 20, 16, generator=torch.Generator().manual_seed(0))
    out = apply_rope(x, ntk_scale=4.0)
    ref = _rope_reference(x.double(), torch.arange(20), 10000.0 * 4.0 ** (16 / 14))
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=0)
    # both options together
    both = apply_rope(x.double(), scale=2.0, ntk_scale=3.0)
    torch.testing.assert_close(both, _rope_reference(x.double(), torch.arange(20, dtype=F64) / 2.0, ntk_scaled_base(1e4, 3.0, 16)))


def test_defaults_leave_apply_rope_unchanged():
    x = torch.randn(2, 2, 12, 8, generator=torch.Generator().manual_seed(0))
    assert torch.equal(apply_rope(x, scale=1.0, ntk_scale=1.0), apply_rope(x))
    assert torch.equal(apply_rope(x, torch.arange(12) + 3, scale=1.0), apply_rope(x, torch.arange(12) + 3))


def test_rotary_embedding_options():
    x = torch.randn(2, 3, 10, 16, dtype=F64, generator=torch.Generator().manual_seed(0))
    pi = RotaryEmbedding(16, scale=2.5)
    torch.testing.assert_close(pi(x), apply_rope(x, scale=2.5))
    torch.testing.assert_close(pi(x, torch.arange(10) + 4), apply_rope(x, torch.arange(10) + 4, scale=2.5))
    ntk = RotaryEmbedding(16, ntk_scale=2.0)
    assert ntk.base == 10000.0 and ntk.rotary_base == pytest.approx(ntk_scaled_base(10000.0, 2.0, 16))
    torch.testing.assert_close(ntk(x), apply_rope(x, ntk_scale=2.0))
    torch.testing.assert_close(ntk(x, torch.arange(10) * 2), apply_rope(x, torch.arange(10) * 2, ntk_scale=2.0))
    torch.testing.assert_close(ntk(x.float()).double(), apply_rope(x, ntk_scale=2.0), atol=1e-5, rtol=0)
    assert "scale=2.5" in repr(pi) and "ntk_scale=2" in repr(ntk)
    assert "scale" not in repr(RotaryEmbedding(16))


@pytest.mark.parametrize("kwargs, exc, msg", [
    (dict(scale=0.0), ValueError, r"scale must be a finite number > 0 \(1 = no scaling\), got 0.0"),
    (dict(scale=-2.0), ValueError, "scale must be a finite number > 0"),
    (dict(scale=float("nan")), ValueError, "scale must be a finite number > 0"),
    (dict(scale="2"), TypeError, r"scale must be a number, got str \('2'\)"),
    (dict(ntk_scale=0.0), ValueError, "ntk_scale must be a finite number > 0"),
    (dict(ntk_scale=[2]), TypeError, "ntk_scale must be a number, got list"),
])
def test_stretching_options_are_validated(kwargs, exc, msg):
    x = torch.randn(1, 4, 8)
    with pytest.raises(exc, match=msg):
        apply_rope(x, **kwargs)
    with pytest.raises(exc, match=msg):
        RotaryEmbedding(8, **kwargs)


def test_ntk_scaled_base_errors():
    with pytest.raises(ValueError, match="head_dim must be >= 4 for NTK scaling"):
        ntk_scaled_base(10000.0, 2.0, 2)
    with pytest.raises(ValueError, match="head_dim must be even"):
        ntk_scaled_base(10000.0, 2.0, 7)
    with pytest.raises(ValueError, match="base must be a finite number > 0"):
        ntk_scaled_base(-1.0, 2.0, 8)
    with pytest.raises(ValueError, match="scale must be a finite number > 0"):
        ntk_scaled_base(10000.0, 0.0, 8)


# ------------------------------------------------------------- helpers.positional
def test_use_rope_base_sets_and_restores():
    model = TinyTransformer(8, 16, 2, 2, max_len=16, pos="rope", seed=0).eval()
    x = torch.randint(0, 8, (2, 12), generator=torch.Generator().manual_seed(0))
    new = ntk_scaled_base(10000.0, 2.0, 8)
    with torch.no_grad():
        ref = model(x)
        with use_rope_base(model, new):
            assert all(m.rope_base == new for m in rope_attention_modules(model))
            changed = model(x)
        assert all(m.rope_base == 10000.0 for m in rope_attention_modules(model))
        torch.testing.assert_close(model(x), ref)
        assert (changed - ref).abs().max() > 1e-4
        # the same as building the model with that base
        other = copy.deepcopy(model)
        for m in other.modules():
            if hasattr(m, "rope_base"):
                m.rope_base = new
        torch.testing.assert_close(changed, other(x))
    with pytest.raises(RuntimeError):
        with use_rope_base(model, 5.0):
            raise RuntimeError("boom")
    assert all(m.rope_base == 10000.0 for m in rope_attention_modules(model))


def test_rope_modules_errors():
    with pytest.raises(ValueError, match=r"model has no RoPE attention .* pos='learned'"):
        rope_attention_modules(TinyTransformer(8, 16, 2, 1, max_len=8, pos="learned"))
    with pytest.raises(TypeError, match="model must be a torch.nn.Module, got str"):
        rope_attention_modules("model")
    with pytest.raises(ValueError, match="base must be a finite number > 0"):
        with use_rope_base(TinyTransformer(8, 16, 2, 1, max_len=8, pos="rope"), 0.0):
            pass


def test_interpolated_positions_match_the_scale_option():
    p = interpolated_positions(32, 2.0)
    assert p.dtype == torch.float32 and p.shape == (32,)
    assert p[-1].item() == 15.5 and p.max() < 16
    x = torch.randn(1, 2, 32, 8, dtype=F64, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(apply_rope(x, p.double()), apply_rope(x, scale=2.0))
    with pytest.raises(ValueError, match="seq_len must be an int >= 1, got 0"):
        interpolated_positions(0, 2.0)
    with pytest.raises(ValueError, match=r"scale must be a finite number > 0 \(L'/L\), got -1"):
        interpolated_positions(4, -1)


def test_accuracy_by_position_against_a_loop():
    model = TinyTransformer(8, 16, 2, 1, max_len=16, pos="rope", seed=0).eval()
    x, y = LookbackTask(num_symbols=8, seq_len=10, k=2).make(40, seed=0)
    acc = accuracy_by_position(model, (x, y))
    pred = model(x).argmax(-1)
    assert acc.shape == (10,) and torch.isnan(acc[:2]).all()
    for t in range(2, 10):
        assert acc[t].item() == pytest.approx((pred[:, t] == y[:, t]).double().mean().item())
    # the mean over positions weighted by the scored counts is evaluate's accuracy (all rows scored equally here)
    assert acc[2:].mean().item() == pytest.approx(evaluate(model, (x, y))[1])
    # forward kwargs reach the model
    torch.testing.assert_close(accuracy_by_position(model, (x, y), offset=7), acc, equal_nan=True)
    with pytest.raises(TypeError, match="data must be a pair"):
        accuracy_by_position(model, x)
    with pytest.raises(ValueError, match="must both have shape"):
        accuracy_by_position(model, (x, y[:, :5]))


def test_shift_length_grid():
    models = {"rope": [TinyTransformer(8, 16, 2, 1, max_len=64, pos="rope", seed=s).eval() for s in (0, 1)],
              "short": [TinyTransformer(8, 16, 2, 1, max_len=12, pos="learned", seed=0).eval()]}
    make = lambda n: LookbackTask(num_symbols=8, seq_len=n, k=2).make(16, seed=3)  # noqa: E731
    g = shift_length_grid(models, make, offsets=[0, 5], lengths=[6, 12], lookback=2, example=1)
    assert isinstance(g, ShiftLengthGrid) and g.schemes == ["rope", "short"]
    assert g.accuracy["rope"].shape == (2, 2, 2) and g.maps["rope"].shape == (2, 2, 12, 12)
    # each cell is evaluate() of that model
    assert g.accuracy["rope"][1, 0, 1] == pytest.approx(evaluate(models["rope"][1], make(12))[1])
    # RoPE: identical accuracy at both offsets; the map of the example row, NaN beyond its length
    np.testing.assert_array_equal(g.accuracy["rope"][:, 0], g.accuracy["rope"][:, 1])
    models["rope"][0](make(6)[0][1:2])
    np.testing.assert_allclose(g.maps["rope"][0, 0, :6, :6], models["rope"][0].attention_weights[0][0, g.head["rope"]].numpy())
    assert np.isnan(g.maps["rope"][0, 0, 6:]).all()
    # the learned table of 12 rows: offset 5 with length 12 does not fit -> NaN, the rest is evaluated
    assert np.isnan(g.accuracy["short"][0, 1, 1]) and np.isnan(g.maps["short"][1, 1]).all()
    assert not np.isnan(g.accuracy["short"][0, 1, 0]) and not np.isnan(g.accuracy["short"][0, 0, 1])
    assert g.tokens[6] == make(6)[0][1].tolist()
    np.testing.assert_allclose(g.mean_accuracy("rope"), g.accuracy["rope"].mean(0))
    with pytest.raises(ValueError, match="offsets must be a non-empty list of ints >= 0"):
        shift_length_grid(models, make, [-1], [6])
    with pytest.raises(ValueError, match="must return sequences of length 7"):
        shift_length_grid(models, lambda n: make(6), [0], [7])
    with pytest.raises(ValueError, match="models must be a non-empty dict"):
        shift_length_grid({}, make, [0], [6])


# ------------------------------------------------------------------ PairRecallTask
def test_pair_recall_task_answers_are_the_stored_values():
    task = PairRecallTask(num_keys=8, num_values=4, num_pairs=6, num_queries=10)
    assert task.vocab_size == 8 * 4 + 8 + 4 and task.seq_len == 16
    x, y = task.make(200, seed=0)
    assert x.shape == y.shape == (200, 16)
    K, V, m = 8, 4, 6
    for row_x, row_y in zip(x.tolist(), y.tolist()):
        pairs = row_x[:m]
        store = {p // V: p % V for p in pairs}
        assert len(store) == m and all(p < K * V for p in pairs)  # distinct keys
        assert row_y[:m] == [IGNORE_INDEX] * m
        for q, a in zip(row_x[m:], row_y[m:]):
            assert K * V <= q < K * V + K and (q - K * V) in store
            assert a == K * V + K + store[q - K * V]
    # fewer queries than pairs: distinct queries
    xq, _ = PairRecallTask(num_queries=4).make(50, seed=1)
    assert all(len(set(r[6:])) == 4 for r in xq.tolist())
    assert "=" in task.decode(x[0], y[0]) and "?" in task.decode(x[0], y[0])


def test_pair_recall_errors():
    with pytest.raises(ValueError, match="num_pairs must be <= num_keys"):
        PairRecallTask(num_keys=4, num_pairs=5)
    with pytest.raises(TypeError, match="num_queries must be an int"):
        PairRecallTask(num_queries=2.0)
    with pytest.raises(ValueError, match="num_values must be >= 2"):
        PairRecallTask(num_values=1)


def test_pair_recall_repacks_associative_recall():
    # same arguments and seed: the same facts and questions as helpers.AssociativeRecallTask, one token per pair
    from helpers import AssociativeRecallTask

    xa, ya = AssociativeRecallTask(8, 4, 6, 10).make(20, seed=5)
    xp, yp = PairRecallTask(8, 4, 6, 10).make(20, seed=5)
    torch.testing.assert_close(xp[:, :6] // 4, xa[:, 0:12:2])          # keys
    torch.testing.assert_close(xp[:, :6] % 4, xa[:, 1:12:2] - 8)       # values
    torch.testing.assert_close(xp[:, 6:] - 32, xa[:, 12::2])           # queries
    torch.testing.assert_close(yp[:, 6:] - 40, ya[:, 12::2] - 8)       # answers


def test_init_position_table_draws_normal_rows_from_the_generator():
    model = TinyTransformer(8, 16, 2, 1, max_len=2000, pos="learned", seed=0)
    out = init_position_table_(model, 0.02, torch.Generator().manual_seed(3))
    assert out is model
    expected = torch.randn(2000, 16, generator=torch.Generator().manual_seed(3)) * 0.02
    torch.testing.assert_close(model.pos_emb.weight.detach(), expected, atol=0, rtol=0)
    # the sample looks like N(0, 0.02^2): 32000 entries
    w = model.pos_emb.weight.detach().double()
    assert abs(w.mean().item()) < 0.001 and abs(w.std().item() - 0.02) < 0.0005
    # the same generator seed gives the same table; the rest of the model is untouched
    other = TinyTransformer(8, 16, 2, 1, max_len=2000, pos="learned", seed=0)
    init_position_table_(other, 0.02, torch.Generator().manual_seed(3))
    for (name, p), (_, q) in zip(model.named_parameters(), other.named_parameters()):
        assert torch.equal(p, q), name
    fresh = TinyTransformer(8, 16, 2, 1, max_len=2000, pos="learned", seed=0)
    assert torch.equal(model.tok_emb.weight, fresh.tok_emb.weight)
    # float64 models get a float64 table
    m64 = TinyTransformer(8, 16, 2, 1, max_len=32, pos="learned", seed=0).double()
    init_position_table_(m64, 1.0, torch.Generator().manual_seed(0))
    assert m64.pos_emb.weight.dtype == torch.float64


@pytest.mark.parametrize(
    "kwargs, exc, msg",
    [
        (dict(model="table"), TypeError, "model must be a torch.nn.Module"),
        (dict(model=TinyTransformer(8, 16, 2, 1, max_len=8, pos="rope")), ValueError, "no learned position table.*'rope'"),
        (dict(std=0.0), ValueError, r"std must be a finite number > 0, got 0.0"),
        (dict(std=float("nan")), ValueError, "std must be a finite number > 0"),
        (dict(std=True), ValueError, "std must be a finite number > 0"),
        (dict(generator=0), TypeError, "generator must be a torch.Generator, got int"),
    ],
)
def test_init_position_table_errors(kwargs, exc, msg):
    args = dict(model=TinyTransformer(8, 16, 2, 1, max_len=8, pos="learned"), std=0.02, generator=torch.Generator())
    args.update(kwargs)
    with pytest.raises(exc, match=msg):
        init_position_table_(args["model"], args["std"], args["generator"])


# ---------------------------------------------------------------- position_similarity, shift_angles
def test_position_similarity_against_a_loop():
    t = torch.randn(7, 5, generator=torch.Generator().manual_seed(0))
    s = position_similarity(t)
    assert s.shape == (7, 7) and s.dtype == F64
    for m in range(7):
        for n in range(7):
            a, b = t[m].double(), t[n].double()
            assert abs(s[m, n].item() - (a @ b / (a.norm() * b.norm())).item()) < 1e-12
    # a sinusoidal table: S depends on m - n only (it is a sum of cosines of (m - n) w_i)
    pe = sinusoidal_encoding(20, 16).double()
    sp = position_similarity(pe)
    torch.testing.assert_close(sp[3:, 3:], sp[:-3, :-3])


@pytest.mark.parametrize("bad, msg", [
    (torch.zeros(3), r"table must be a 2-D float tensor \(positions, d\), got \(3,\)"),
    (torch.zeros(3, 2, dtype=torch.long), r"table must be a 2-D float tensor"),
    (torch.zeros(3, 2), r"table has an all-zero row"),
])
def test_position_similarity_errors(bad, msg):
    with pytest.raises(ValueError, match=msg):
        position_similarity(bad)


@given(c=st.integers(-2000, 2000), half=st.integers(1, 16))
@FAST
def test_shift_angles_turn_the_sinusoidal_pairs(c, half):
    d = 2 * half
    a = shift_angles(c, d)
    assert a.shape == (half,) and bool((a > -math.pi).all()) and bool((a <= math.pi).all())
    # reference: the angle from pair (sin, cos)(m w) to pair (sin, cos)((m + c) w), read with atan2
    m = 3
    p0, p1 = sinusoidal_encoding(torch.tensor([m]), d).double()[0], sinusoidal_encoding(torch.tensor([m + c]), d).double()[0]
    for i in range(half):
        z0 = complex(p0[2 * i + 1].item(), p0[2 * i].item())  # cos + i sin = exp(i m w)
        z1 = complex(p1[2 * i + 1].item(), p1[2 * i].item())
        ref = math.atan2((z1 / z0).imag, (z1 / z0).real)
        diff = (a[i].item() - ref + math.pi) % (2 * math.pi) - math.pi
        assert abs(diff) < 1e-4  # float32 table entries


def test_shift_angles_values_and_errors():
    torch.testing.assert_close(shift_angles(100, 32)[:3], torch.tensor([-0.5310, -0.3145, 0.2069], dtype=F64), atol=1e-4, rtol=0)
    torch.testing.assert_close(shift_angles(10, 32)[:3], torch.tensor([-2.5664, -0.6598, -3.1209], dtype=F64), atol=1e-4, rtol=0)
    assert shift_angles(math.pi, 2).item() == math.pi  # the wrap is (-pi, pi]
    with pytest.raises(ValueError, match=r"offset must be a finite number, got inf"):
        shift_angles(float("inf"), 4)
    with pytest.raises(ValueError, match=r"d_model must be an even int >= 2, got 5"):
        shift_angles(1, 5)


def test_pair_recall_task_lives_in_tasks_and_is_re_exported():
    import helpers
    import helpers.tasks

    assert PairRecallTask is helpers.tasks.PairRecallTask is helpers.PairRecallTask
    assert "PairRecallTask" in helpers.tasks.__all__


# ------------------------------------------------------------- T5's relative position bias
from helpers.positional import T5BiasTransformer, relative_position_bucket, t5_bias  # noqa: E402

T5_SETTINGS = [(True, 32, 128), (False, 32, 128), (False, 8, 12), (True, 8, 12), (False, 2, 3), (True, 4, 5),
               (False, 16, 64), (True, 64, 1000)]


def _hf_bucket():
    modeling_t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    return modeling_t5.T5Attention._relative_position_bucket


@pytest.mark.parametrize("bidirectional, num_buckets, max_distance", T5_SETTINGS)
def test_relative_position_bucket_equals_hugging_face(bidirectional, num_buckets, max_distance):
    r = torch.arange(-3000, 3001)
    ours = relative_position_bucket(r, bidirectional, num_buckets, max_distance)
    ref = _hf_bucket()(r, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance)
    assert ours.dtype == torch.long and torch.equal(ours, ref.long())
    assert int(ours.min()) >= 0 and int(ours.max()) == num_buckets - 1


@FAST
@given(st.booleans(), st.integers(1, 40), st.integers(1, 300), st.integers(-2000, 2000))
def test_relative_position_bucket_equals_hugging_face_property(bidirectional, half, extra, r0):
    nb = 2 * half + (2 if bidirectional else 0)
    max_exact = (nb // 2 if bidirectional else nb) // 2
    md = max_exact + extra
    r = torch.arange(r0 - 50, r0 + 50).reshape(10, 10)  # any shape
    assert torch.equal(relative_position_bucket(r, bidirectional, nb, md),
                       _hf_bucket()(r, bidirectional=bidirectional, num_buckets=nb, max_distance=md).long())


def test_relative_position_bucket_against_the_formula_written_out():
    # causal, 8 buckets, max_distance 12: E = 4 exact distances, then 4 + floor(ln(d/4)/ln(3) * 4), capped at 7
    def ref(d):
        return d if d < 4 else min(7, 4 + int(math.floor(math.log(d / 4) / math.log(3) * 4)))
    d = torch.arange(0, 200)
    assert relative_position_bucket(-d, False, 8, 12).tolist() == [ref(int(v)) for v in d]
    assert relative_position_bucket(-d[:20], False, 8, 12).tolist() == [0, 1, 2, 3, 4, 4, 5, 6, 6, 6] + [7] * 10
    # keys after the query (r > 0) all share bucket 0 when causal; bidirectional puts them in the upper half
    assert relative_position_bucket(torch.arange(1, 30), False, 8, 12).eq(0).all()
    up = relative_position_bucket(torch.arange(1, 30), True, 16, 12)
    assert up.ge(8).all() and torch.equal(up - 8, relative_position_bucket(-torch.arange(1, 30), True, 16, 12))


@pytest.mark.parametrize("kwargs, exc, msg", [
    (dict(relative_position=torch.arange(3.0)), TypeError, "relative_position must be an integer tensor"),
    (dict(relative_position=[0, 1]), TypeError, "relative_position must be an integer tensor"),
    (dict(relative_position=torch.tensor([True])), TypeError, "relative_position must be an integer tensor"),
    (dict(relative_position=torch.arange(3), bidirectional=1), TypeError, "bidirectional must be a bool"),
    (dict(relative_position=torch.arange(3), num_buckets=1, bidirectional=False), ValueError, "num_buckets must be an int >= 2"),
    (dict(relative_position=torch.arange(3), num_buckets=7), ValueError, "num_buckets must be an even int >= 4"),
    (dict(relative_position=torch.arange(3), num_buckets=2.0), ValueError, "num_buckets must be"),
    (dict(relative_position=torch.arange(3), num_buckets=32, max_distance=8), ValueError, "max_distance must be an int > max_exact = 8"),
    (dict(relative_position=torch.arange(3), num_buckets=8, max_distance=4, bidirectional=False), ValueError,
     "max_distance must be an int > max_exact = 4"),
    (dict(relative_position=torch.arange(3), max_distance=128.0), ValueError, "max_distance must be"),
])
def test_relative_position_bucket_errors(kwargs, exc, msg):
    with pytest.raises(exc, match=msg):
        relative_position_bucket(**kwargs)


def test_t5_bias_against_a_loop_and_hugging_face_compute_bias():
    table = torch.randn(8, 2, generator=torch.Generator().manual_seed(0))
    n = 40
    bias = t5_bias(torch.arange(n), table, 12)
    assert bias.shape == (2, n, n) and bias.dtype == table.dtype
    for i in range(n):
        for j in range(n):
            if j > i:
                assert torch.isneginf(bias[:, i, j]).all()
            else:
                b = int(relative_position_bucket(torch.tensor(j - i), False, 8, 12))
                assert torch.equal(bias[:, i, j], table[b])
    modeling_t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    from transformers import T5Config

    cfg = T5Config(d_model=32, d_kv=16, num_heads=2, relative_attention_num_buckets=8,
                   relative_attention_max_distance=12, is_decoder=True)
    attn = modeling_t5.T5Attention(cfg, has_relative_attention_bias=True, layer_idx=0)
    with torch.no_grad():
        attn.relative_attention_bias.weight.copy_(table)
        ref = attn.compute_bias(n, n)[0]  # (heads, n, n), no mask
    keep = torch.ones(n, n, dtype=torch.bool).tril()
    torch.testing.assert_close(bias[:, keep], ref[:, keep], atol=0, rtol=0)
    # bidirectional: HF's encoder bias everywhere
    cfg_enc = T5Config(d_model=32, d_kv=16, num_heads=2, relative_attention_num_buckets=8,
                       relative_attention_max_distance=12, is_decoder=False)
    enc = modeling_t5.T5Attention(cfg_enc, has_relative_attention_bias=True, layer_idx=0)
    with torch.no_grad():
        enc.relative_attention_bias.weight.copy_(table)
        torch.testing.assert_close(t5_bias(torch.arange(n), table, 12, causal=False), enc.compute_bias(n, n)[0],
                                   atol=0, rtol=0)


def test_t5_bias_shift_batch_and_errors():
    table = torch.randn(32, 3, generator=torch.Generator().manual_seed(1), requires_grad=True)
    p = torch.arange(20)
    assert torch.equal(t5_bias(p + 1000, table, 128), t5_bias(p, table, 128))
    assert torch.equal(t5_bias(p.double() + 7, table, 128), t5_bias(p, table, 128))  # integer-valued floats are fine
    batch = t5_bias(torch.stack([p, p + 5]), table, 128)
    assert batch.shape == (2, 3, 20, 20) and torch.equal(batch[1], batch[0])
    t5_bias(p, table, 128).masked_fill(torch.ones(20, 20, dtype=torch.bool).triu(1), 0).sum().backward()
    assert table.grad is not None and table.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="integer positions"):
        t5_bias(torch.arange(20) / 2, table, 128)
    with pytest.raises(ValueError, match="positions must be a"):
        t5_bias(torch.zeros(2, 2, 2), table, 128)
    with pytest.raises(ValueError, match="table must be a"):
        t5_bias(p, torch.zeros(32), 128)
    with pytest.raises(ValueError, match="table must be a"):
        t5_bias(p, torch.zeros(32, 2, dtype=torch.long), 128)


def test_t5_bias_transformer_matches_an_inline_forward():
    model = T5BiasTransformer(10, 32, 2, 2, max_len=64, num_buckets=8, max_distance=12, seed=3).double()
    plain = TinyTransformer(10, 32, 2, 2, max_len=64, pos="none", seed=3).double()
    ours = dict(model.named_parameters())
    assert set(ours) - set(dict(plain.named_parameters())) == {"rel_bias.weight"}
    for name, p in plain.named_parameters():
        assert torch.equal(ours[name], p), name  # the rest is drawn exactly as pos="none"
    assert model.rel_bias.weight.std().item() == pytest.approx(32 ** -0.5, rel=0.5)
    x = torch.randint(0, 10, (3, 30), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model(x)
        blk, h = model.blocks[0], model.blocks[0].ln1(model.tok_emb(x))
        q, k = blk.attn.split_heads(blk.attn.linear_q(h)), blk.attn.split_heads(blk.attn.linear_k(h))
        s = q @ k.transpose(-2, -1) / math.sqrt(16) + t5_bias(torch.arange(30), model.rel_bias.weight, 12)
        torch.testing.assert_close(model.attention_weights[0], torch.softmax(s, -1))
        # relative: the logits do not depend on a shift of every position
        torch.testing.assert_close(model(x, offset=500), out, atol=1e-12, rtol=0)
    assert "num_buckets=8, max_distance=12" in repr(model)


def test_t5_bias_transformer_trains_its_bias_and_errors():
    task = LookbackTask(num_symbols=8, seq_len=16, k=3)
    model = T5BiasTransformer(task.vocab_size, 32, 2, 1, max_len=64, num_buckets=8, max_distance=12, seed=0)
    before = model.rel_bias.weight.detach().clone()
    train(model, task, steps=5, lr=1e-2, seed=0, n_train=64, n_val=16, eval_every=5)
    assert not torch.equal(model.rel_bias.weight, before)
    again = T5BiasTransformer(task.vocab_size, 32, 2, 1, max_len=64, num_buckets=8, max_distance=12, seed=0)
    assert torch.equal(again.rel_bias.weight, before)  # seeded
    with pytest.raises(TypeError, match="do not pass pos="):
        T5BiasTransformer(8, 32, 2, 1, 64, pos="rope")
    with pytest.raises(TypeError, match="do not pass causal="):
        T5BiasTransformer(8, 32, 2, 1, 64, causal=False)
    with pytest.raises(ValueError, match="max_distance must be an int > max_exact = 16"):
        T5BiasTransformer(8, 32, 2, 1, 64, num_buckets=32, max_distance=10)
    with pytest.raises(ValueError, match="num_buckets must be an int >= 2"):
        T5BiasTransformer(8, 32, 2, 1, 64, num_buckets=1)
    with pytest.raises(ValueError, match="integer positions"):
        model(torch.zeros(1, 4, dtype=torch.long), positions=torch.arange(4) / 2)
    from helpers.kvcache import KVCache
    with pytest.raises(ValueError, match="does not support a KV cache"):
        model(torch.zeros(1, 4, dtype=torch.long), cache=KVCache(1))
