"""Peak memory of a call, on any device: an allocation counter built on ``TorchDispatchMode``.

A measuring instrument of notebook 08 §3 (the score matrix that FlashAttention never stores):
:func:`peak_memory` runs a call under :class:`AllocationCounter` and reports the most bytes of
tensors alive at once. ``benchmarks/flash_bench.py`` compares it with torch's profiler.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .traffic import tensors_in

__all__ = ["AllocationCounter", "MemoryReport", "peak_memory"]


class AllocationCounter(TorchDispatchMode):
    r"""Counts the bytes of the tensors that torch operations create inside a ``with`` block, and their peak.

    Every ATen operation run inside the block (on any device, forward and backward) passes through
    this ``TorchDispatchMode``: each result whose storage is not one of the operation's inputs'
    (a new buffer, not a view or an in-place result) is counted with its storage's ``nbytes`` until
    the last tensor using that storage is freed (a ``weakref.finalize`` per tensor). ``current`` is
    what is alive now, ``peak`` the most that was alive at once, ``allocated`` the sum of every new
    buffer, ``ops`` the name of every operation seen (e.g. which attention kernel ran).

    What it does not see: buffers a kernel allocates for itself and frees before returning
    (scratch space inside a fused kernel: e.g. the tiles of ``F.scaled_dot_product_attention``'s
    CPU flash kernel), tensors created before the block, and the allocator's own caching.
    Why this rather than ``torch.profiler.profile(profile_memory=True)``, which sees the CPU
    allocator itself: the counter is exact and the same on every run and machine (it depends on
    shapes and dtypes only), costs one Python call per operation, and prints nothing; the
    profiler (torch 2.13, CPU) took about 2.7 s on its first use in one run here, writes kineto log lines to the process's
    stderr, and reports per-event sizes that must be summed in time order.
    ``benchmarks/flash_bench.py`` reports both, and ``tests/test_flash.py`` checks they agree on
    plain attention.
    """

    def __init__(self) -> None:
        super().__init__()
        self.current = 0
        self.peak = 0
        self.allocated = 0
        self.n_allocations = 0
        self.ops: list[str] = []
        self._live: dict[int, list] = {}   # storage key -> [nbytes, number of live tensors using it]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.ops.append(str(func.overloadpacket.__name__))
        inputs = {self._key(t) for t in tensors_in((args, kwargs))}
        for t in tensors_in(out):
            self._track(t, inputs)
        return out

    @staticmethod
    def _key(t: torch.Tensor) -> int:
        return t.untyped_storage()._cdata

    def _track(self, t: torch.Tensor, inputs: set) -> None:
        key = self._key(t)
        entry = self._live.get(key)
        if entry is None:
            if key in inputs:             # a view of, or an in-place result on, a tensor from outside
                return
            nbytes = t.untyped_storage().nbytes()
            entry = self._live[key] = [nbytes, 0]
            self.current += nbytes
            self.allocated += nbytes
            self.n_allocations += 1
            self.peak = max(self.peak, self.current)
        entry[1] += 1
        weakref.finalize(t, self._release, key)

    def _release(self, key: int) -> None:
        entry = self._live.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            self.current -= entry[0]
            del self._live[key]


@dataclass
class MemoryReport:
    """What :func:`peak_memory` measured. Byte counts; ``result`` is what the call returned."""

    peak_bytes: int
    allocated_bytes: int
    n_allocations: int
    retained_bytes: int
    ops: list = field(repr=False, default_factory=list)
    result: Any = field(repr=False, default=None)


def peak_memory(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> MemoryReport:
    r"""Run ``fn(*args, **kwargs)`` under :class:`AllocationCounter` and report its peak memory.

    ``peak_bytes``: the most bytes of tensors created by the call alive at the same time (its
    result included while it is being built); ``retained_bytes``: what is still alive when it
    returns (its result, and anything saved for backward); ``allocated_bytes``: every new buffer,
    summed; ``ops``: the operations that ran. Exact: it depends only on shapes, dtypes and the code
    path, not on the machine.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    counter = AllocationCounter()
    with counter:
        result = fn(*args, **kwargs)
    return MemoryReport(counter.peak, counter.allocated, counter.n_allocations, counter.current, counter.ops, result)
