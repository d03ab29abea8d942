"""Tests of helpers.tasks: deterministic synthetic tasks, splits and accuracy."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.tasks import (
    IGNORE_INDEX,
    AssociativeRecallTask,
    CopyTask,
    LookbackTask,
    MixedTask,
    Task,
    TwoPositionTask,
    accuracy,
    make_task,
)

SETTINGS = settings(max_examples=20, deadline=None)
NAMES = ["copy", "reverse", "lookback", "recall", "mixed"]


@SETTINGS
@given(name=st.sampled_from(NAMES), seed=st.integers(0, 2**31 - 1), n=st.integers(0, 20))
def test_make_is_deterministic_and_well_formed(name, seed, n):
    task = make_task(name)
    x1, y1 = task.make(n, seed)
    x2, y2 = task.make(n, seed)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert x1.shape == y1.shape == (n, task.seq_len)
    assert x1.dtype == y1.dtype == torch.long
    if n:
        assert 0 <= int(x1.min()) and int(x1.max()) < task.vocab_size
        scored = y1[y1 != IGNORE_INDEX]
        assert scored.numel() > 0 and 0 <= int(scored.min()) and int(scored.max()) < task.vocab_size


@pytest.mark.parametrize("name", NAMES)
def test_different_seeds_differ(name):
    task = make_task(name)
    assert not torch.equal(task.make(32, 0)[0], task.make(32, 1)[0])


def test_copy_and_reverse_targets():
    for reverse in (False, True):
        task = CopyTask(num_symbols=5, length=4, reverse=reverse)
        x, y = task.make(10, 0)
        assert task.seq_len == 8 and task.vocab_size == 6
        a = x[:, :4]
        assert (x[:, 4] == task.sep).all()
        assert (y[:, :4] == IGNORE_INDEX).all()
        assert torch.equal(y[:, 4:], a.flip(1) if reverse else a)
        assert torch.equal(x[:, 5:], y[:, 4:7])  # inputs are targets shifted by one (teacher forcing)


@pytest.mark.parametrize("k", [0, 1, 3])
def test_lookback_targets(k):
    task = LookbackTask(num_symbols=6, seq_len=10, k=k)
    x, y = task.make(8, 1)
    assert (y[:, :k] == IGNORE_INDEX).all()
    assert torch.equal(y[:, k:], x[:, : 10 - k])


def test_associative_recall_targets():
    task = AssociativeRecallTask(num_keys=6, num_values=5, num_pairs=3, num_queries=2)
    assert task.seq_len == 2 * (3 + 2) - 1 and task.vocab_size == 11
    x, y = task.make(50, 2)
    for row_x, row_y in zip(x.tolist(), y.tolist()):
        keys, values = row_x[0:6:2], row_x[1:6:2]
        assert len(set(keys)) == 3 and all(k < 6 for k in keys) and all(6 <= v < 11 for v in values)
        table = dict(zip(keys, values))
        scored = [t for t, v in enumerate(row_y) if v != IGNORE_INDEX]
        assert scored == [6, 8]
        for t in scored:
            assert row_x[t] in table and row_y[t] == table[row_x[t]]


def test_mixed_task_layout():
    sub = [LookbackTask(num_symbols=4, seq_len=6, k=1), CopyTask(num_symbols=3, length=2)]
    task = MixedTask(sub)
    assert task.vocab_size == 4 + 2 + 1 and task.seq_len == 7
    x, y = task.make(40, 0)
    ids = task.task_ids(x)
    assert set(ids.tolist()) == {0, 1}
    assert (y[:, 0] == IGNORE_INDEX).all()
    copy_rows = x[ids == 1]
    assert (copy_rows[:, 5:] == task.pad).all()  # CopyTask has seq_len 4: padded after
    assert (y[ids == 1][:, 5:] == IGNORE_INDEX).all()
    look_x, look_y = x[ids == 0], y[ids == 0]
    assert torch.equal(look_y[:, 2:], look_x[:, 1:6])


@pytest.mark.parametrize("name", NAMES)
def test_split_is_deterministic_and_disjoint(name):
    task = make_task(name)
    s1, s2 = task.split(200, 50, seed=5), task.split(200, 50, seed=5)
    for a, b in zip(s1.train + s1.val, s2.train + s2.val):
        assert torch.equal(a, b)
    assert s1.train[0].shape == (200, task.seq_len) and s1.val[0].shape == (50, task.seq_len)
    train_rows = {tuple(r) for r in s1.train[0].tolist()}
    assert not any(tuple(r) in train_rows for r in s1.val[0].tolist())


def test_split_impossible_raises():
    tiny = CopyTask(num_symbols=2, length=1)  # only 2 distinct sequences
    with pytest.raises(ValueError, match=r"could not draw n_val=5 validation sequences distinct from the 50 training ones"):
        tiny.split(50, 5, seed=0)


def test_accuracy_counts_only_scored_positions():
    targets = torch.tensor([[IGNORE_INDEX, 1, 2], [0, IGNORE_INDEX, IGNORE_INDEX]])
    preds = torch.tensor([[0, 1, 0], [0, 0, 0]])  # right, wrong, right at the scored positions
    logits = torch.nn.functional.one_hot(preds, 3).float()
    assert accuracy(logits, targets) == pytest.approx(2 / 3)
    assert Task.accuracy(logits, targets) == pytest.approx(2 / 3)
    x, y = make_task("lookback").make(4, 0)
    perfect = torch.nn.functional.one_hot(y.clamp(min=0), 8).float()
    assert accuracy(perfect, y) == 1.0
    assert accuracy(logits, torch.full((2, 3), IGNORE_INDEX)) != accuracy(logits, targets)  # NaN
    with pytest.raises(ValueError, match=r"logits must have shape targets.shape \+ \(vocab,\), got logits \(2, 3, 3\) and targets \(2, 2\)"):
        accuracy(logits, targets[:, :2])


def test_decode_and_repr():
    task = CopyTask(num_symbols=3, length=2)
    x, y = task.make(1, 0)
    text = task.decode(x[0], y[0])
    assert text.startswith("in : ") and "|" in text and "\nout: " in text and "." in text
    assert repr(task) == "CopyTask(num_symbols=3, length=2, reverse=False)"
    recall = make_task("recall")
    rx, ry = recall.make(1, 0)
    assert recall.decode(rx[0], ry[0]).split("\n")[0].split()[2].startswith("k")  # keys are named k0, k1, ...


def test_task_errors():
    with pytest.raises(ValueError, match=r"k must be < seq_len \(something must be scored\), got k=5, seq_len=5"):
        LookbackTask(seq_len=5, k=5)
    with pytest.raises(ValueError, match=r"num_pairs must be <= num_keys .* got num_pairs=5, num_keys=4"):
        AssociativeRecallTask(num_keys=4, num_pairs=5)
    with pytest.raises(ValueError, match=r"name must be one of .* got 'sort'"):
        make_task("sort")
    with pytest.raises(ValueError, match=r"n must be >= 0, got -1"):
        make_task("copy").make(-1, 0)
    with pytest.raises(TypeError, match=r"seed must be an int, got float"):
        make_task("copy").make(3, 0.5)
    with pytest.raises(ValueError, match=r"tasks must be a non-empty sequence of Task objects"):
        MixedTask([])
    with pytest.raises(ValueError, match=r"num_symbols must be >= 2, got 1"):
        CopyTask(num_symbols=1)


# ------------------------------------------------------------ two positions
@SETTINGS
@given(S=st.integers(2, 6), n=st.integers(5, 10), a=st.integers(1, 3), b=st.integers(1, 3), seed=st.integers(0, 99))
def test_two_position_task_targets_and_determinism(S, n, a, b, seed):
    if a == b:
        b = a + 1  # <= 4 < n
    task = TwoPositionTask(S, n, (a, b))
    x, y = task.make(16, seed)
    x2, y2 = task.make(16, seed)
    assert torch.equal(x, x2) and torch.equal(y, y2)  # same seed, same data
    assert x.shape == y.shape == (16, n) and int(x.max()) < S
    assert task.vocab_size == S + S * S
    m = max(a, b)
    assert bool((y[:, :m] == IGNORE_INDEX).all())
    for t in range(m, n):
        torch.testing.assert_close(y[:, t], S + S * x[:, t - a] + x[:, t - b])
    assert int(y[:, m:].max()) < task.vocab_size
    names = task.token_names()
    assert names[S + S * 1 + 0] == "1:0"


def test_two_position_task_split_and_repr():
    task = TwoPositionTask(8, 12, (1, 3))
    s = task.split(64, 16, seed=0)
    assert not ({tuple(r) for r in s.train[0].tolist()} & {tuple(r) for r in s.val[0].tolist()})
    assert "offsets=(1, 3)" in repr(task)
    assert not torch.equal(task.make(4, 0)[0], task.make(4, 1)[0])


def test_two_position_task_bad_input():
    with pytest.raises(ValueError, match=r"offsets must be two different ints in \[1, seq_len=12\), got \(2, 2\)"):
        TwoPositionTask(8, 12, (2, 2))
    with pytest.raises(ValueError, match=r"offsets must be two different ints in \[1, seq_len=4\), got \(1, 4\)"):
        TwoPositionTask(8, 4, (1, 4))
    with pytest.raises(TypeError, match=r"offsets must be a pair of ints \(a, b\), got 3"):
        TwoPositionTask(8, 12, 3)
    with pytest.raises(ValueError, match=r"num_symbols must be >= 2, got 1"):
        TwoPositionTask(1, 12)
