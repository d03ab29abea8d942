"""Tests of helpers.train: a deterministic loop that reduces the loss."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helpers.model import TinyTransformer
from helpers.tasks import IGNORE_INDEX, LookbackTask, Split
from helpers.train import TrainResult, cross_entropy_loss, evaluate, train

TASK = LookbackTask(num_symbols=6, seq_len=10, k=2)


def _model(seed=0, **kw):
    return TinyTransformer(TASK.vocab_size, 32, 2, 1, TASK.seq_len, pos="rope", seed=seed, **kw)


@pytest.fixture(autouse=True)
def deterministic():
    """seed_everything's settings (1 thread, deterministic algorithms), restored afterwards.

    One thread is also much faster for these tiny models: on a busy 2-core machine two
    threads made a 5-step run about 20x slower.
    """
    threads, det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    yield
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(det)


def test_training_reduces_loss_and_learns_the_task():
    r = train(_model(), TASK, steps=150, n_train=1024, n_val=256, seed=0)
    assert isinstance(r, TrainResult) and len(r.losses) == r.steps == 150
    assert r.losses[-1] < 0.25 * r.losses[0]
    assert r.val_acc > 0.95 and r.train_acc > 0.95


def test_same_seed_gives_bit_identical_losses():
    kw = dict(steps=25, n_train=256, n_val=64, seed=7)
    a = train(_model(dropout=0.1), TASK, **kw)
    b = train(_model(dropout=0.1), TASK, **kw)
    assert a.losses == b.losses
    assert (a.train_loss, a.train_acc, a.val_loss, a.val_acc) == (b.train_loss, b.train_acc, b.val_loss, b.val_acc)
    c = train(_model(dropout=0.1), TASK, **{**kw, "seed": 8})
    assert c.losses != a.losses


def test_global_rng_untouched():
    state = torch.random.get_rng_state()
    train(_model(dropout=0.2), TASK, steps=3, n_train=64, n_val=16)
    assert torch.equal(torch.random.get_rng_state(), state)


def test_loss_fn_and_penalty_are_used():
    kw = dict(steps=5, n_train=128, n_val=32)
    base = train(_model(), TASK, **kw)
    const = train(_model(), TASK, penalty=lambda m: torch.tensor(1.0), **kw)
    # a constant penalty adds to every loss and changes no gradient
    assert const.losses == pytest.approx([loss + 1.0 for loss in base.losses], abs=1e-5)

    def smoothed(logits, targets):
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX, label_smoothing=0.1)

    ls = train(_model(), TASK, loss_fn=smoothed, **kw)
    assert ls.losses[0] != base.losses[0]
    l2 = train(_model(), TASK, penalty=lambda m: 1e-2 * sum(p.pow(2).sum() for p in m.parameters()), **kw)
    assert l2.losses[0] > base.losses[0]


def test_weight_decay_shrinks_weights():
    kw = dict(steps=40, n_train=128, n_val=32, lr=1e-2)
    m0, m1 = _model(), _model()
    train(m0, TASK, **kw)
    train(m1, TASK, weight_decay=1.0, **kw)
    norm = lambda m: sum(p.pow(2).sum() for p in m.parameters()).item()  # noqa: E731
    assert norm(m1) < norm(m0)
    sgd = train(_model(), TASK, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1), **kw)
    assert sgd.steps == 40


def test_data_forms_and_early_stop():
    split = TASK.split(512, 128, seed=0)
    r = train(_model(), split, steps=400, eval_every=20, stop_at_acc=0.9)
    assert r.steps < 400 and r.history[-1][0] == r.steps and r.history[-1][2] >= 0.9
    assert [h[0] for h in r.history] == list(range(20, r.steps + 1, 20))
    pair = train(_model(), split.train, steps=3)
    assert pair.val_acc != pair.val_acc  # NaN: no validation data
    both = train(_model(), (split.train, split.val), steps=3)
    from_split = train(_model(), Split(split.train, split.val), steps=3)
    assert both.losses == from_split.losses


def test_evaluate_restores_mode_and_matches_loss():
    m = _model(dropout=0.1).train()
    x, y = TASK.make(100, 0)
    loss, acc = evaluate(m, (x, y), batch_size=33)
    assert m.training
    m.eval()
    with torch.no_grad():
        assert loss == pytest.approx(float(cross_entropy_loss(m(x), y)), rel=1e-5)
    assert 0.0 <= acc <= 1.0


def test_progress_output(capsys):
    train(_model(), TASK, steps=3, n_train=64, n_val=16)
    assert capsys.readouterr().out == ""
    r = train(_model(), TASK, steps=3, n_train=64, n_val=16, progress=True)
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.strip() == r.summary() and out.startswith("steps 3  loss ")
    train(_model(), TASK, steps=4, n_train=64, n_val=16, log_every=2)
    assert capsys.readouterr().out.count("\n") == 2


def test_train_errors():
    m = _model()
    with pytest.raises(ValueError, match=r"steps must be an int >= 1, got 0"):
        train(m, TASK, steps=0)
    with pytest.raises(ValueError, match=r"lr must be a number > 0, got -1"):
        train(m, TASK, lr=-1)
    with pytest.raises(ValueError, match=r"stop_at_acc needs eval_every > 0"):
        train(m, TASK, stop_at_acc=0.9)
    with pytest.raises(TypeError, match=r"data must be a Task, a Split, an \(inputs, targets\) pair .* got str"):
        train(m, "lookback")
    with pytest.raises(TypeError, match=r"model must be a torch.nn.Module, got function"):
        train(lambda x: x, TASK)
    x, y = TASK.make(4, 0)
    with pytest.raises(ValueError, match=r"inputs and targets must have the same number of rows, got 4 and 3"):
        train(m, (x, y[:3]))
