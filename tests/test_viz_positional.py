"""Tests of helpers.viz.positional: the pure state function of notebook 06's explorer, and the explorer."""
from __future__ import annotations

import numpy as np
import pytest

from helpers.model import TinyTransformer
from helpers.positional import shift_length_grid
from helpers.tasks import LookbackTask
from helpers.viz.positional import shift_length_explorer, shift_length_state


@pytest.fixture(scope="module")
def grid():
    models = {pos: [TinyTransformer(8, 16, 2, 1, max_len=128, pos=pos, seed=s).eval() for s in (0, 1)]
              for pos in ["learned", "rope"]}
    return shift_length_grid(models, lambda n: LookbackTask(num_symbols=8, seq_len=n, k=3).make(32, seed=0),
                             offsets=[0, 1, 50], lengths=[8, 16], lookback=3)


def test_state_reads_the_grid(grid):
    s = shift_length_state(grid, "learned", 50, 16)
    per_model = grid.accuracy["learned"][:, 2, 1]
    assert s["accuracy"] == pytest.approx(per_model.mean())
    assert s["acc_min"] == per_model.min() and s["acc_max"] == per_model.max()
    assert (s["i_offset"], s["i_length"], s["length"], s["offset"]) == (2, 1, 16, 50)
    assert s["curves"].shape == (2, 3)
    np.testing.assert_allclose(s["curves"][1], grid.accuracy["learned"][:, :, 1].mean(0))
    np.testing.assert_array_equal(s["map"], grid.maps["learned"][2, 1])
    # weight on the token 3 back, from the map
    w = grid.maps["learned"][2, 1]
    assert s["weight_at_k"] == pytest.approx(np.mean([w[t, t - 3] for t in range(3, 16)]))
    assert s["tokens"] == grid.tokens[16]
    short = shift_length_state(grid, "rope", 0, 8)
    assert np.isnan(short["map"][8:]).all() and not np.isnan(short["map"][:8, :8]).any()
    # RoPE rows of the curves are flat in the offset
    assert np.all(short["curves"] == short["curves"][:, :1])


def test_state_errors(grid):
    with pytest.raises(ValueError, match=r"scheme must be one of \['learned', 'rope'\], got 'none'"):
        shift_length_state(grid, "none", 0, 8)
    with pytest.raises(ValueError, match=r"offset must be one of \[0, 1, 50\], got 2"):
        shift_length_state(grid, "rope", 2, 8)
    with pytest.raises(ValueError, match=r"length must be one of \[8, 16\], got 9"):
        shift_length_state(grid, "rope", 0, 9)
    with pytest.raises(TypeError, match="grid must be a helpers.positional.ShiftLengthGrid, got dict"):
        shift_length_state({}, "rope", 0, 8)


def test_explorer_updates_figure_and_summary(grid):
    ex = shift_length_explorer(grid, scheme="rope", offset=0, length=8)
    assert set(ex.controls) == {"scheme", "offset", "length"}
    for name, value in [("offset", 50), ("length", 16), ("scheme", "learned")]:
        before, label = ex.image.value, ex.label.value
        s = ex.set(**{name: value})
        assert s[name] == value
        assert ex.image.value != before and ex.label.value != label
    assert "learned" in ex.label.value and "offset 50" in ex.label.value
    with pytest.raises(ValueError, match="unknown control"):
        ex.set(seed=1)
