"""Forward time of helpers.MultiHeadAttention vs torch.nn.MultiheadAttention.

Shape of the issue: batch 8, seq 256, d_model 256, 8 heads, float32, CPU; median of
repeated runs after warm-up, under ``torch.no_grad()`` with both modules in eval mode
(the inference setting; ``nn.MultiheadAttention`` then takes its native fast path).

Rows (each ratio is ours / torch's counterpart):

* ``fused``: ``need_weights=False``. Ours calls ``F.scaled_dot_product_attention``;
  torch's module its fused kernel. Target of the issue: ratio <= 1.5.
* ``weights``: ``need_weights=True`` with per-head weights (torch:
  ``average_attn_weights=False``); ours runs the explicit formula.
* ``+causal`` rows: the same with a causal mask (ours: bool True = allowed; torch: ``~mask``).

Usage::

    python benchmarks/attention_bench.py [--repeats 30] [--threads N]

Only the standard library and torch.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers.attention import MultiHeadAttention, causal_mask  # noqa: E402


def median_ms(fn_a, fn_b, repeats: int, warmup: int) -> tuple[float, float]:
    """Median wall times (ms) of ``fn_a()`` and ``fn_b()``, run alternately ``repeats`` times.

    Alternating the two inside one loop makes a change of machine load (other processes
    on a shared CPU) hit both alike instead of biasing the ratio.
    """
    for _ in range(warmup):
        fn_a()
        fn_b()
    ta, tb = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn_a()
        t1 = time.perf_counter()
        fn_b()
        t2 = time.perf_counter()
        ta.append(t1 - t0)
        tb.append(t2 - t1)
    return 1e3 * statistics.median(ta), 1e3 * statistics.median(tb)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave torch's default)")
    ap.add_argument("--target", type=float, default=1.5, help="ratio the fused row must not exceed")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    ref = torch.nn.MultiheadAttention(args.d_model, args.heads, batch_first=True).eval()
    ours = MultiHeadAttention.from_torch(ref).eval()
    x = torch.randn(args.batch, args.seq, args.d_model)
    mask = causal_mask(args.seq)
    inv = ~mask

    with torch.no_grad():
        # Same numbers first: a benchmark of a wrong function is worthless.
        a = ours(x, mask=mask)[0]
        b = ref(x, x, x, attn_mask=inv, need_weights=False)[0]
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)

        cases = [
            ("fused", lambda: ours(x, need_weights=False), lambda: ref(x, x, x, need_weights=False)),
            ("fused+causal", lambda: ours(x, mask=mask, need_weights=False),
             lambda: ref(x, x, x, attn_mask=inv, need_weights=False)),
            ("weights", lambda: ours(x, need_weights=True),
             lambda: ref(x, x, x, need_weights=True, average_attn_weights=False)),
            ("weights+causal", lambda: ours(x, mask=mask, need_weights=True),
             lambda: ref(x, x, x, attn_mask=inv, need_weights=True, average_attn_weights=False)),
        ]
        print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, float32, no_grad, eval; "
              f"batch {args.batch}, seq {args.seq}, d_model {args.d_model}, heads {args.heads}; "
              f"median of {args.repeats} alternating runs after {args.warmup} warm-up")
        print(f"{'case':<16}{'ours ms':>10}{'torch ms':>10}{'ratio':>8}")
        fused_ratio = None
        for name, f_ours, f_ref in cases:
            t_ours, t_ref = median_ms(f_ours, f_ref, args.repeats, args.warmup)
            ratio = t_ours / t_ref
            if name == "fused":
                fused_ratio = ratio
            print(f"{name:<16}{t_ours:>10.2f}{t_ref:>10.2f}{ratio:>8.2f}")
    verdict = "PASS" if fused_ratio <= args.target else "FAIL"
    print(f"{verdict}: fused ratio {fused_ratio:.2f} (target <= {args.target})")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    raise SystemExit(main())
