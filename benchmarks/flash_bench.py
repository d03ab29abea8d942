"""Time and peak memory of attention: plain (scores materialised), torch's SDPA, and the from-scratch tiles.

Notebook 08 (``notebooks/08_attention_cost_flashattention.ipynb``) shows a small sweep within its
time budget; this script runs the full one, L = 512 ... 8192 by default, batch 1, one head,
head_dim 64, float32, CPU, under ``torch.no_grad()``. For each implementation and length:

* ``ms``: median wall time of ``--repeats`` calls after one warm-up call (the implementations
  alternate inside each repeat, so a change of machine load hits them alike);
* ``counted MiB``: the peak of ``helpers.lab.memory.peak_memory`` (the allocation counter: tensors
  created by torch operations; it does not see scratch space inside a fused kernel);
* ``allocator MiB``: the peak of the CPU allocator's own events recorded by
  ``torch.profiler.profile(profile_memory=True)`` (sees everything the allocator hands out,
  the fused kernel's scratch included).

Rows: ``plain`` (``helpers.flash.materialized_attention``), ``sdpa``
(``F.scaled_dot_product_attention``; on a CPU build of torch 2.13 its default is the CPU flash
kernel ``_scaled_dot_product_flash_attention_for_cpu``), ``tiles`` (``helpers.flash.flash_attention_forward``,
a Python loop over ``--block`` x ``--block`` tiles: a teaching implementation).

Usage::

    python benchmarks/flash_bench.py [--lengths 512 1024 2048 4096 8192] [--block 256] [--repeats 5] [--threads N] [--causal]

Speed is reported, never asserted (CONTRIBUTING.md); the memory goal of issue 24 (at L = 4096
the tiles need at least 8x less peak memory than plain) is printed as a PASS/FAIL line.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers.flash import flash_attention_forward, materialized_attention  # noqa: E402
from helpers.lab.memory import peak_memory  # noqa: E402


def allocator_peak(fn) -> int:
    """Peak bytes of the CPU allocator's events while ``fn()`` runs (torch.profiler, profile_memory=True)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    running = peak = 0
    for _, nbytes in events:
        running += nbytes
        peak = max(peak, running)
    return peak


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=1)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--block", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave torch's default)")
    ap.add_argument("--causal", action="store_true")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    impls = {
        "plain": lambda q, k, v: materialized_attention(q, k, v, causal=args.causal)[0],
        "sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=args.causal),
        "tiles": lambda q, k, v: flash_attention_forward(q, k, v, causal=args.causal, block_q=args.block, block_k=args.block)[0],
    }
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()}, batch {args.batch}, heads {args.heads}, head_dim {args.head_dim}, "
          f"tiles {args.block} x {args.block}, causal {args.causal}, float32, median of {args.repeats}")
    print("| L | implementation | ms | counted MiB | allocator MiB | x plain (allocator) |")
    print("|---|---|---|---|---|---|")
    goal = None
    with torch.no_grad():
        for L in args.lengths:
            q, k, v = (torch.randn(args.batch, args.heads, L, args.head_dim) for _ in range(3))
            ref = impls["plain"](q, k, v)
            for name, f in impls.items():           # same numbers first: a benchmark of a wrong function is worthless
                err = float((f(q, k, v) - ref).abs().max())
                if err > 1e-4:
                    raise SystemExit(f"{name} differs from plain attention at L = {L} by {err}")
            times = {name: [] for name in impls}
            for _ in range(args.repeats):
                for name, f in impls.items():
                    t0 = time.perf_counter()
                    f(q, k, v)
                    times[name].append(1e3 * (time.perf_counter() - t0))
            peaks = {name: (peak_memory(f, q, k, v).peak_bytes, allocator_peak(lambda: f(q, k, v))) for name, f in impls.items()}
            for name in impls:
                counted, alloc = peaks[name]
                print(f"| {L} | {name} | {statistics.median(times[name]):.2f} | {counted / 2**20:.2f} | {alloc / 2**20:.2f} | "
                      f"{alloc / peaks['plain'][1]:.3f} |")
            if L == 4096:
                goal = peaks["plain"][1] / peaks["tiles"][1], peaks["plain"][0] / peaks["tiles"][0]
    if goal is not None:
        ok = min(goal) >= 8
        print(f"{'PASS' if ok else 'FAIL'} memory goal at L = 4096: tiles need {goal[0]:.0f}x (allocator) / {goal[1]:.0f}x "
              f"(counter) less peak memory than plain (target >= 8x)")
        return 0 if ok else 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
