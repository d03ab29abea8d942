"""Count the distinct lines of ``helpers`` one call executes (issue 31's reading-cost measure).

    python tools/trace_lines.py            # the traced counts of the reference calls, with their lines

A line is counted once however often it runs; lines of torch, of the standard library and of
this script are not counted. Each call is made once untraced first, so a cache that the first
call fills (RoPE's cos/sin tables) is counted in its steady state, as a learner's second call
runs it; ``--first`` counts the first call instead.
"""
from __future__ import annotations

import argparse
import linecache
import os
import sys
from typing import Callable

import torch

import helpers

HELPERS_DIR = os.path.dirname(os.path.abspath(helpers.__file__)) + os.sep


def traced_lines(fn: Callable, *args, warm: bool = True, **kwargs) -> list[tuple[str, int]]:
    """The sorted distinct ``(file, line)`` pairs of ``helpers`` that ``fn(*args, **kwargs)`` executes."""
    if warm:
        fn(*args, **kwargs)
    seen: set[tuple[str, int]] = set()

    def local(frame, event, arg):
        if event == "line":
            seen.add((frame.f_code.co_filename, frame.f_lineno))
        return local

    def glob(frame, event, arg):
        if frame.f_code.co_filename.startswith(HELPERS_DIR):
            return local
        return None

    old = sys.gettrace()
    sys.settrace(glob)
    try:
        fn(*args, **kwargs)
    finally:
        sys.settrace(old)
    return sorted(seen)


def reference_calls() -> dict[str, tuple[Callable, tuple, dict]]:
    """The calls issue 31 budgets: a default ``MultiHeadAttention`` call (with and without a causal
    mask) and a float32 ``apply_rope`` call."""
    torch.manual_seed(0)
    mha = helpers.MultiHeadAttention(16, 2)
    x = torch.randn(2, 5, 16)
    mask = helpers.causal_mask(5)
    q = torch.randn(2, 2, 5, 8)
    return {
        "MultiHeadAttention(16, 2)(x)": (mha, (x,), {}),
        "MultiHeadAttention(16, 2)(x, mask=causal_mask(5))": (mha, (x,), {"mask": mask}),
        "apply_rope(x) float32": (helpers.apply_rope, (q,), {}),
    }


BUDGETS = {
    "MultiHeadAttention(16, 2)(x)": 40,
    "MultiHeadAttention(16, 2)(x, mask=causal_mask(5))": 40,
    "apply_rope(x) float32": 25,
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--first", action="store_true", help="count the first call (no untraced warm-up)")
    ap.add_argument("--quiet", action="store_true", help="print only the counts")
    a = ap.parse_args(argv)
    for name, (fn, args, kwargs) in reference_calls().items():
        lines = traced_lines(fn, *args, warm=not a.first, **kwargs)
        print(f"{name}: {len(lines)} distinct lines (budget {BUDGETS[name]})")
        if not a.quiet:
            for f, n in lines:
                print(f"    {os.path.relpath(f, os.path.dirname(HELPERS_DIR.rstrip(os.sep)))}:{n}: "
                      f"{linecache.getline(f, n).rstrip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
