"""Tests of ``helpers.lab.traffic`` (notebook 02, section 6): the memory-traffic logger.

The logger rests on ``torch.overrides.TorchFunctionMode``. The first tests pin down what
that hook sees in the installed torch (which calls reach it, in what form); if a torch
release changes it, they fail here, with a message, before notebook 02's table drifts.
"""
from __future__ import annotations

import pytest
import torch

import helpers
from helpers.lab.traffic import MemoryTraffic, OpRecord, memory_traffic


def x_(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


# ------------------------------------------------------------- the hook itself
def test_torch_function_mode_is_the_public_one_and_sees_calls():
    from torch.overrides import TorchFunctionMode

    assert issubclass(MemoryTraffic, TorchFunctionMode), "MemoryTraffic must use torch.overrides.TorchFunctionMode"
    seen = []

    class Spy(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(getattr(func, "__name__", None))
            return func(*args, **(kwargs or {}))

    x = x_(4, 8)
    with Spy():
        y = x * 2.0
        torch.stack((x, y))
        y.addcmul_(x, x)
    names = [n for n in seen if n != "__get__"]
    assert names == ["mul", "stack", "addcmul_"], (
        f"torch.overrides.TorchFunctionMode no longer reports calls as before (got {names}); "
        "helpers.lab.traffic's classification (views, in-place by trailing '_', out=) must be re-checked"
    )


def test_nested_calls_are_logged_once():
    # Tensor.unflatten is written in Python on top of other torch calls: one record only.
    x = x_(2, 8)
    with MemoryTraffic() as log:
        x.unflatten(-1, (4, 2))
    assert [r.name for r in log.records] == ["unflatten"]
    assert log.records[0].kind == "view"


# ------------------------------------------------------------- classification
def test_elementwise_compute_counts_bytes_exactly():
    x, c = x_(16, 32), x_(32)
    with MemoryTraffic() as log:
        x * c
    (r,) = log.records
    assert r == OpRecord("mul", "compute", x.nbytes + c.nbytes, x.nbytes, x.nbytes, False)
    assert r.traffic_bytes == 2 * x.nbytes + c.nbytes


def test_views_move_nothing():
    x = x_(4, 8)
    with MemoryTraffic() as log:
        x[..., 0::2]
        x.view(8, 4)
        x.float()  # already float32: returns x itself
        torch.view_as_complex(x.view(4, 4, 2))
    assert all(r.kind == "view" and r.traffic_bytes == 0 and not r.strided for r in log.records)
    assert log.summary(x.nbytes) == {"ops": 0, "views": 5, "big_buffers": 0, "traffic": 0.0, "strided_ops": 0}


def test_in_place_out_and_allocation_are_not_new_buffers():
    x = x_(4, 8)
    with MemoryTraffic() as log:
        out = torch.empty_like(x)
        torch.mul(x, 2.0, out=out)
        out.addcmul_(x, x)
        out += x
        out[:, :4] = x[:, 4:]
    kinds = [r.kind for r in log.records if r.kind != "view"]
    assert kinds == ["allocate", "out=", "in-place", "in-place", "in-place"]
    s = log.summary(x.nbytes)
    assert s["big_buffers"] == 1  # only the empty_like
    # out=: read x, write out; addcmul_: read out, x, x, write out; +=: read out, x, write out; setitem: half, half
    assert s["traffic"] == pytest.approx(2 + 4 + 3 + 1)


def test_strided_last_dimension_is_flagged():
    x = x_(4, 8)
    with MemoryTraffic() as log:
        x[..., 0::2] * 2.0
        x[..., :4] * 2.0  # contiguous runs: stride 1 in the last dimension
    assert [r.strided for r in log.records if r.kind == "compute"] == [True, False]


def test_memory_traffic_of_rope_forms():
    x = x_(1, 2, 64, 16)
    helpers.apply_rope(x)  # fill the memoised table outside the measurement
    s = memory_traffic(helpers.apply_rope, x)
    cos = torch.randn(64, 16)
    floor = memory_traffic(lambda t: t * cos, x)
    assert floor == {"ops": 1, "views": 0, "big_buffers": 1, "traffic": pytest.approx(2 + cos.nbytes / x.nbytes), "strided_ops": 0}
    assert s["traffic"] <= 1.1 * floor["traffic"] and s["strided_ops"] == 0

    def stack_form(t):  # GPT-J's rotate_every_two: strided reads and a stacked copy
        return torch.stack((-t[..., 1::2], t[..., 0::2]), dim=-1).flatten(-2)

    st = memory_traffic(stack_form, x)
    assert st["strided_ops"] == 2 and st["traffic"] == pytest.approx((0.5 + 0.5) + (0.5 + 0.5 + 1))  # neg: half in, half out; stack: two halves in, |x| out


def test_errors():
    with pytest.raises(ValueError, match=r"unit_bytes must be a positive int \(e.g. x.nbytes\), got 0"):
        MemoryTraffic().summary(0)
    with pytest.raises(ValueError, match=r"big_fraction must be in \(0, 1\], got 2"):
        MemoryTraffic().summary(8, big_fraction=2)
    with pytest.raises(ValueError, match="unit_bytes must be given when no positional argument is a tensor"):
        memory_traffic(lambda: torch.zeros(3))
