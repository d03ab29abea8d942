"""Count the memory traffic of a piece of PyTorch code: operations, new buffers, bytes, strides.

Taught in ``notebooks/appendix/02a_rope_cost_on_a_cpu.ipynb`` (§2; notebook 02 §6 states the point):
an element-wise RoPE is memory-bound, so what makes one implementation faster than another is how many times
it passes over memory. :class:`MemoryTraffic` logs, for every call into torch's Python
API made inside a ``with`` block, the bytes it reads and writes, whether it allocates a
new full-size buffer, and whether it touches a non-contiguous (strided) last dimension.

It is built on :class:`torch.overrides.TorchFunctionMode`, the *public* mode hook of the
``__torch_function__`` protocol (documented in PyTorch's "Extending PyTorch" notes). The
lower-level ``TorchDispatchMode``, which sees individual ATen kernels, lives in the private
module ``torch.utils._python_dispatch``; it is not used here (:mod:`helpers.lab.memory` uses it).
The difference matters for what is counted: one logged operation is one call such as ``torch.stack`` or
``x * cos``, however many kernels torch runs inside it; its traffic is the size of its
tensor inputs plus its tensor outputs, i.e. the traffic of an ideal kernel for that call.

Every count is exact and independent of the machine (it depends on shapes, dtypes and
strides only), so a notebook may print it and the tests may compare it.

``tests/test_traffic.py`` pins the behaviour of the hook itself (which calls are seen, how
views, in-place and ``out=`` calls are classified): if a torch release changes it, that
test fails loudly before any notebook number drifts.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["OpRecord", "MemoryTraffic", "memory_traffic", "tensors_in"]


@dataclass(frozen=True)
class OpRecord:
    """One logged call.

    Attributes:
        name: the function's ``__name__`` (for debugging; notebooks print counts, not names).
        kind: ``"compute"`` (returns a new tensor), ``"in-place"`` (a trailing-underscore
            method such as ``addcmul_`` or ``+=``), ``"out="`` (writes into a given tensor),
            ``"view"`` (every output shares memory with an input: slicing, ``view_as_complex``,
            ``flatten`` of a contiguous tensor, ``.float()`` of a float32 tensor: no data moved)
            ``t[index] = value`` is logged as ``"in-place"`` (reads ``value``, writes the region)
            or ``"allocate"`` (``empty``/``empty_like``: memory obtained, nothing written).
        read_bytes: total ``nbytes`` of the tensor arguments (for ``out=``, without ``out``).
        write_bytes: total ``nbytes`` of the tensor results.
        new_buffer_bytes: bytes of freshly allocated results (0 for views, in-place, ``out=``).
        strided: some tensor read or written has a last dimension with stride != 1.
    """

    name: str
    kind: str
    read_bytes: int
    write_bytes: int
    new_buffer_bytes: int
    strided: bool

    @property
    def traffic_bytes(self) -> int:
        """Bytes read plus bytes written (0 for views and plain allocations)."""
        return self.read_bytes + self.write_bytes


def tensors_in(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in tensors_in(o)]
    if isinstance(obj, dict):
        return [t for o in obj.values() for t in tensors_in(o)]
    return []


def _storage_ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


# Python's augmented assignments (``x += y`` ...) on a tensor: in place, like trailing-underscore methods.
_AUGMENTED = frozenset(
    f"__i{op}__" for op in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and", "or", "xor", "lshift", "rshift")
)


def _is_strided(t: torch.Tensor) -> bool:
    return t.dim() > 0 and t.shape[-1] > 1 and t.stride(-1) != 1


class MemoryTraffic(TorchFunctionMode):
    """Context manager that logs the memory traffic of every torch call made inside it.

    ``with MemoryTraffic() as log: f(x)`` then read ``log.records`` (a list of
    :class:`OpRecord`) or ``log.summary(unit_bytes=x.nbytes)``.

    Only calls that return at least one tensor are logged (shape, dtype and stride
    queries are not). Calls made *inside* a logged call are not logged again (the mode is
    off while a call runs), so a Python-level torch function counts once.
    """

    def __init__(self) -> None:
        super().__init__()
        self.records: list[OpRecord] = []

    def __torch_function__(self, func: Callable, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = getattr(func, "__name__", repr(func))
        if name == "__setitem__" and isinstance(args[0], torch.Tensor):
            # t[index] = value: reads the value tensor(s), writes the indexed region of t.
            region, values = args[0][args[1]], tensors_in(list(args[2:]))
            self.records.append(OpRecord(name, "in-place", sum(v.nbytes for v in values), region.nbytes, 0,
                                         any(_is_strided(t) for t in values + [region])))
            return out
        results = tensors_in(out)
        if not results:
            return out
        inputs = tensors_in(args) + tensors_in({k: v for k, v in kwargs.items() if k != "out"})
        strided = any(_is_strided(t) for t in inputs + results)
        read = sum(t.nbytes for t in inputs)
        write = sum(t.nbytes for t in results)
        in_place = (name.endswith("_") and not name.endswith("__")) or name in _AUGMENTED
        if "out" in kwargs:
            kind, new = "out=", 0
        elif in_place:
            kind, new = "in-place", 0
        elif name.startswith("empty"):
            kind, read, write, new = "allocate", 0, 0, write
        elif inputs and all(_storage_ptr(r) in {_storage_ptr(t) for t in inputs} for r in results):
            kind, read, write, new, strided = "view", 0, 0, 0, False
        else:
            kind, new = "compute", write
        self.records.append(OpRecord(name, kind, read, write, new, strided))
        return out

    def summary(self, unit_bytes: int, big_fraction: float = 0.5) -> dict:
        """Counts over the logged calls, bytes in units of ``unit_bytes`` (e.g. ``x.nbytes``).

        Returns a dict with ``ops`` (calls that move data: ``compute``, ``in-place``, ``out=``),
        ``views``, ``big_buffers`` (new buffers, computed or only allocated, of at least
        ``big_fraction * unit_bytes``),
        ``traffic`` (bytes read + written / ``unit_bytes``) and ``strided_ops`` (calls
        that read or write a last dimension with stride != 1).
        """
        if not isinstance(unit_bytes, int) or isinstance(unit_bytes, bool) or unit_bytes <= 0:
            raise ValueError(f"unit_bytes must be a positive int (e.g. x.nbytes), got {unit_bytes!r}")
        if not 0 < big_fraction <= 1:
            raise ValueError(f"big_fraction must be in (0, 1], got {big_fraction!r}")
        moving = [r for r in self.records if r.kind in ("compute", "in-place", "out=")]
        return {
            "ops": len(moving),
            "views": sum(r.kind == "view" for r in self.records),
            "big_buffers": sum(r.new_buffer_bytes >= big_fraction * unit_bytes for r in self.records),
            "traffic": sum(r.traffic_bytes for r in moving) / unit_bytes,
            "strided_ops": sum(r.strided for r in moving),
        }


def memory_traffic(fn: Callable[..., Any], *args: Any, unit_bytes: int | None = None, **kwargs: Any) -> dict:
    """Run ``fn(*args, **kwargs)`` once under :class:`MemoryTraffic` and return its summary.

    ``unit_bytes`` defaults to the size of the first tensor argument, so ``traffic`` is in
    units of :math:`|x|`: an element-wise kernel that reads ``x`` once and writes a result of
    the same size moves 2.
    """
    if unit_bytes is None:
        first = next(iter(tensors_in(list(args))), None)
        if first is None:
            raise ValueError("unit_bytes must be given when no positional argument is a tensor")
        unit_bytes = first.nbytes
    with MemoryTraffic() as log:
        fn(*args, **kwargs)
    return log.summary(unit_bytes)
