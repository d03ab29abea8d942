"""Kernel-side latency of every explorer of the lesson notebooks, stage by stage (issue 34).

For each lesson notebook (01-08) this script starts a Jupyter kernel (nbclient, in ``notebooks/``, like
nbval and JupyterLab), runs the cells its explorers need (the same cells the browser test runs:
``tests/browser/test_lab_sliders.py::cells_the_explorers_need``), finds the :class:`helpers.viz.Explorer`
objects each explorer cell made, and moves every slider of each over its range with ``explorer.set()``.
Each update records its stages in ``explorer.stage_ms`` (:meth:`Explorer.update`): compute, draw (artists
moved), render (Agg), encode (PNG) and send (the new PNG and summary handed to the widgets, which send them
to the front end over the kernel's comm). The table gives, per explorer, the median and the max of each stage
and of their total over all moves.

The browser's part (websocket transfer, image decode, paint) is the browser test's key/drag -> new figure
latency minus this total: ``python -m pytest -m browser tests/browser -p no:cacheprovider`` prints both.

    python benchmarks/explorer_latency.py                  # every lesson notebook
    python benchmarks/explorer_latency.py 01 04 --moves 8  # some notebooks, fewer positions per slider
    python benchmarks/explorer_latency.py --save           # also write benchmarks/results/explorer_latency_DATE.txt

Speed is reported, never asserted: the target (median <= 150 ms and max <= 250 ms from a key press to the new
figure, per explorer, idle 2-core machine) is for the browser's number, of which this is the kernel's share.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STAGES = ("compute", "draw", "render", "encode", "send", "total")

# Registers the Explorer objects made since the last call, with the cell that made them (runs in the kernel).
REGISTER = """
import gc as _bench_gc
from helpers.viz.explorer import Explorer as _BenchExplorer
_bench_found = globals().setdefault("_bench_found", [])
_bench_ids = {id(e) for e, _ in _bench_found}
_bench_found += [(o, {cell}) for o in _bench_gc.get_objects() if isinstance(o, _BenchExplorer) and id(o) not in _bench_ids]
"""

# Moves every slider of every registered explorer over its range, then back; prints one JSON line.
MOVE = r"""
import json as _bench_json
import numpy as _bench_np

def _bench_positions(w, n):
    if getattr(w, "_options_values", None):  # SelectionSlider, Dropdown, ToggleButtons: every option
        return list(w._options_values)
    lo, hi, step = w.min, w.max, w.step
    count = int(round((hi - lo) / step)) + 1
    idx = sorted(set(_bench_np.linspace(0, count - 1, min(n, count)).round().astype(int).tolist()))
    vals = [lo + i * step for i in idx]
    vals = [int(v) if isinstance(lo, int) and isinstance(step, int) else round(float(v), 10) for v in vals]
    if isinstance(w.value, tuple):  # a range slider: move its upper end, its lower end kept
        return [(w.value[0], v) for v in vals if v >= w.value[0]]
    return vals

def _bench_names(o):
    return [k for k, v in globals().items() if v is o and not k.startswith("_")]

_bench_out = []
for _bench_e, _bench_cell in _bench_found:
    _bench_first = dict(_bench_e.values)
    _bench_n0 = len(_bench_e.stage_ms)  # moves made by earlier cells (the notebook's own checks) are not counted
    for _bench_name, _bench_w in _bench_e.controls.items():
        for _bench_v in _bench_positions(_bench_w, {moves}):
            if _bench_v != _bench_e.controls[_bench_name].value:
                _bench_e.set(**{_bench_name: _bench_v})
        _bench_e.set(**{_bench_name: _bench_first[_bench_name]})
    _bench_png = bytes(_bench_e.image.value)  # the PNG's own size (IHDR: width, height at bytes 16-24)
    _bench_out.append({"cell": _bench_cell, "names": _bench_names(_bench_e), "controls": list(_bench_e.controls),
                       "size": [int.from_bytes(_bench_png[16:20], "big"), int.from_bytes(_bench_png[20:24], "big")],
                       "png_bytes": len(_bench_png),
                       "blit": bool(_bench_e.animated), "stages": _bench_e.stage_ms[_bench_n0:]})
print("BENCH-JSON " + _bench_json.dumps(_bench_out))
"""


def _needed_cells(nb: dict):
    sys.path[:0] = [str(REPO), str(REPO / "tools")]
    try:
        from tests.browser.test_lab_sliders import cells_the_explorers_need
    finally:
        del sys.path[:2]
    return cells_the_explorers_need(nb)


def measure_notebook(path: Path, moves: int, timeout: int = 600) -> list[dict]:
    """Run the cells ``path``'s explorers need in a fresh kernel and move every slider; one dict per explorer."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    explorers, needed = _needed_cells(json.loads(path.read_text(encoding="utf-8")))
    code = [c for c in nb.cells if c.cell_type == "code"]
    cells = []
    for i in needed:
        cells.append(nbformat.v4.new_code_cell(code[i].source))
        if i in explorers:
            cells.append(nbformat.v4.new_code_cell(REGISTER.replace("{cell}", str(i))))
    cells.append(nbformat.v4.new_code_cell(MOVE.replace("{moves}", str(moves))))
    run = nbformat.v4.new_notebook(cells=cells, metadata=nb.metadata)
    client = NotebookClient(run, timeout=timeout, kernel_name="python3", allow_errors=False,
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    for out in run.cells[-1].outputs:
        if out.get("name") == "stdout":
            for line in out["text"].splitlines():
                if line.startswith("BENCH-JSON "):
                    return json.loads(line[len("BENCH-JSON "):])
    raise RuntimeError(f"{path.name}: the benchmark cell printed no result: {run.cells[-1].outputs}")


def _fmt(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} / {max(values):.1f}"


def table(results: dict[str, list[dict]]) -> list[str]:
    head = "| explorer | moves | frame (px), PNG | " + " | ".join(f"{s} ms med / max" for s in STAGES) + " |"
    lines = [head, "|" + "---|" * (3 + len(STAGES))]
    for nb, found in results.items():
        for k, r in enumerate(found):
            name = f"{nb[:2]} `{r['names'][0] if r['names'] else 'explorer'}`" + ("" if r["blit"] else " (no blit)")
            cols = [_fmt([m[s] for m in r["stages"]]) for s in STAGES]
            size = f"{r['size'][0]}x{r['size'][1]}, {r['png_bytes'] / 1024:.0f} KiB"
            lines.append(f"| {name} | {len(r['stages'])} | {size} | " + " | ".join(cols) + " |")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("notebooks", nargs="*", help="notebook numbers (01 ... 08); default: every lesson with explorers")
    ap.add_argument("--moves", type=int, default=12, help="positions per slider over its range (default 12)")
    ap.add_argument("--save", action="store_true", help="also write the output to benchmarks/results/")
    args = ap.parse_args(argv)
    paths = [p for p in sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb")) if p.stem != "00_daily_practice"]
    if args.notebooks:
        paths = [p for p in paths if p.name[:2] in {n.zfill(2) for n in args.notebooks}]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    cores = os.cpu_count()
    header = [f"explorer_latency {_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.processor() or platform.machine()}, "
              f"{cores} cores, load average {load:.2f} at start" + (" (busy: numbers not representative)" if load >= (cores or 1) else "")]
    print(header[0], flush=True)
    results, t0 = {}, time.perf_counter()
    for p in paths:
        t = time.perf_counter()
        results[p.name] = measure_notebook(p, args.moves)
        print(f"  {p.name}: {len(results[p.name])} explorer(s), {time.perf_counter() - t:.0f} s", flush=True)
    lines = header + [f"load average at end {os.getloadavg()[0]:.2f}; {time.perf_counter() - t0:.0f} s in all", ""] + table(results)
    print("\n".join(lines[1:]))
    if args.save:
        out = REPO / "benchmarks" / "results" / f"explorer_latency_{_dt.date.today():%Y-%m-%d}.txt"
        with open(out, "a", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n\n")
        print(f"appended to {out.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
