"""The perturbed-arithmetic pass (tests/perturbed_arithmetic/): what it moves, what it keeps, and that
nbval's kernels really run under it."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent / "perturbed_arithmetic"
_spec = importlib.util.spec_from_file_location("perturbed_arithmetic_under_test", HERE / "perturb.py")
pa = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pa)


def _ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    ints = {torch.float32: torch.int32, torch.float64: torch.int64, torch.float16: torch.int16,
            torch.bfloat16: torch.int16}[a.dtype]
    return (a.view(ints).long() - b.view(ints).long()).abs()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_perturb_moves_inexact_values_by_one_ulp(dtype):
    x = torch.randn(10_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64).to(dtype)
    p = pa.perturb(x)
    d = _ulps(p, x)
    assert d.max() == 1
    low = (1 << pa.EXACT_LOW_BITS[dtype]) - 1
    inexact = (x.view(pa._INT_VIEW[dtype]) & low) != 0
    assert (d[inexact] == 1).all() and (d[~inexact] == 0).all()
    assert 0.3 < (p > x).float().mean() < 0.7          # both directions, about equally often


def test_perturb_keeps_exact_values():
    exact = torch.tensor([0.0, -0.0, 1.0, 3.0, 0.5, 255 / 256, -37.0, 1024.0, float("inf"), -float("inf")])
    assert torch.equal(pa.perturb(exact), exact)
    nan = torch.tensor([float("nan")])
    assert pa.perturb(nan).isnan().all()
    ints = torch.arange(5)
    assert pa.perturb(ints) is ints


def test_perturb_is_a_function_of_the_value():
    x = torch.randn(50, generator=torch.Generator().manual_seed(1))
    y = torch.cat([x, x.flip(0)])
    p = pa.perturb(y)
    assert torch.equal(p[:50], p[50:].flip(0))


def test_perturb_keeps_strides_and_complex():
    x = torch.randn(6, 4, dtype=torch.float64).T
    p = pa.perturb(x)
    assert p.shape == x.shape and _ulps(p.contiguous(), x.contiguous()).max() == 1
    z = torch.randn(8, dtype=torch.complex64)
    pz = pa.perturb(z)
    assert pz.dtype == torch.complex64 and 0 < (pz - z).abs().max() < 1e-6


def _run_ops():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(32, 32, generator=g), torch.randn(32, 32, generator=g)
    w = torch.randn(32, 32, generator=g, requires_grad=True)
    out = {
        "mm": a @ b,
        "sum": a.sum(),
        "mean": a.mean(0),
        "norm": torch.linalg.vector_norm(a, dim=1),
        "softmax": torch.softmax(a, -1),
        "layer_norm": F.layer_norm(a, (32,)),
        "sdpa": F.scaled_dot_product_attention(a[None, None], b[None, None], a[None, None]),
        "det": torch.linalg.det(a.double()),
        "exp": a.exp(),
        "add": a + b,                 # correctly rounded everywhere: not perturbed
        "max": a.amax(1),             # exact: not perturbed
    }
    (a @ w).sum().backward()
    out["grad"] = w.grad
    o = torch.empty(32, 32)
    torch.mm(a, b, out=o)
    out["mm out="] = o
    return out


def test_mode_moves_order_dependent_ops_and_only_those():
    plain = _run_ops()
    pa.counts.clear()
    with pa.PerturbedArithmetic():
        moved = _run_ops()
        again = _run_ops()
    for name in plain:
        if name in ("add", "max"):
            assert torch.equal(moved[name], plain[name]), name
            continue
        assert not torch.equal(moved[name], plain[name]), f"{name} was not perturbed"
        torch.testing.assert_close(moved[name], plain[name], rtol=1e-5, atol=1e-6)
        assert torch.equal(moved[name], again[name]), f"{name}: the same inputs gave different results"
    assert pa.counts.get("mm", 0) >= 2            # forward and backward products are both seen


def test_masked_softmax_zeros_stay_exact():
    s = torch.randn(4, 4)
    mask = torch.ones(4, 4, dtype=torch.bool).tril()
    with pa.PerturbedArithmetic():
        w = torch.softmax(s.masked_fill(~mask, float("-inf")), -1)
        acc = (torch.tensor([1, 0, 1, 1]) == 1).float().mean()
    assert (w[~mask] == 0).all() and acc.item() == 0.75


def test_an_ipython_kernel_started_with_the_pass_runs_under_it():
    """The startup file is what puts nbval's kernels under the mode (IPYTHONDIR, as in .ci/run)."""
    code = ("import torch, json; a = torch.linspace(0.1, 1, 64).reshape(8, 8); "
            "print(json.dumps({'flag': globals().get('__perturbed_arithmetic__', False), "
            "'mm': (a @ a).flatten().tolist()}))")
    env = dict(os.environ, IPYTHONDIR=str(HERE / "ipython"))
    r = subprocess.run([sys.executable, "-m", "IPython", "--no-banner", "-c", code],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["flag"] is True
    a = torch.linspace(0.1, 1, 64).reshape(8, 8)
    assert torch.tensor(got["mm"]).reshape(8, 8).ne(a @ a).any()


def test_one_term_reductions_are_not_moved():
    """A mean over a dimension of size 1 (GQA pooling into groups of one) is exact on every CPU."""
    x = torch.randn(8, 1, 16, dtype=torch.float64)
    a, b = torch.randn(5, 1), torch.randn(1, 7)
    with pa.PerturbedArithmetic():
        m = x.mean(1)
        s = x.sum(dim=(1,))
        p = a @ b
        full = x.mean(2)
    assert torch.equal(m, x[:, 0]) and torch.equal(s, x[:, 0]) and torch.equal(p, a * b)
    assert not torch.equal(full, x.mean(2))


def test_a_training_run_moves_but_stays_close():
    """Like another CPU: the same seed gives a slightly different trajectory (the claim, not the digits, holds)."""
    import helpers
    from helpers import TinyTransformer, make_task, train

    def run():
        helpers.seed_everything(0)
        task = make_task("recall")
        model = TinyTransformer(task.vocab_size, 32, 2, num_layers=2, max_len=64, seed=0)
        return train(model, task, steps=30, seed=0).losses

    native = run()
    with pa.PerturbedArithmetic():
        moved = run()
    assert native != moved
    assert max(abs(a - b) / a for a, b in zip(native, moved)) < 1e-2
