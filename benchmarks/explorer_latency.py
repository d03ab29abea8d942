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
    python benchmarks/explorer_latency.py --drag 02 08     # a drag across each explorer's first slider, replayed

``--drag`` replays what the browser does during a drag across an explorer's first slider, from its minimum to past its
maximum (40 pointer moves, one every 40 ms, like the browser test's drag): the client sends each new value as the
comm message JupyterLab sends, at most one at a time (ipywidgets' throttle: the next value waits, merged, until the
kernel reports idle for the previous one), and times the explorer's frames as they arrive. It reports the time from
the pointer move that reached the final value to the frame that shows it (the kernel's share of the browser test's
"final figure after the move that reached it", which that test counts from the last move before the last message
sent, never an earlier one), and from the stage record (``stage_ms``: each frame's start on the
shared monotonic clock, how long it waited on the coalescer's timer, how long it took) the frames that followed
that move.

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


# For a drag: the first slider of every registered explorer, as the browser sees it; prints one JSON line.
DRAG_INFO = r"""
import json as _bench_json
_bench_info = []
for _bench_e, _bench_cell in _bench_found:
    _bench_name, _bench_w = next(iter(_bench_e.controls.items()))
    _bench_opts = list(getattr(_bench_w, "_options_values", None) or [])
    if _bench_opts:
        _bench_first, _bench_last = _bench_opts[0], _bench_opts[-1]
    else:
        _bench_first = (_bench_w.value[0], _bench_w.min) if isinstance(_bench_w.value, tuple) else _bench_w.min
        _bench_last = (_bench_w.value[0], _bench_w.max) if isinstance(_bench_w.value, tuple) else _bench_w.max
    _bench_info.append({"cell": _bench_cell, "control": _bench_name, "model_id": _bench_w.model_id,
                        "timing_id": _bench_e.timing.model_id, "n_options": len(_bench_opts),
                        "min": None if _bench_opts else _bench_w.min, "max": None if _bench_opts else _bench_w.max,
                        "step": None if _bench_opts else _bench_w.step, "range": isinstance(_bench_w.value, tuple),
                        "first": _bench_json.loads(_bench_json.dumps(_bench_first, default=str)),
                        "final": _bench_json.loads(_bench_json.dumps(_bench_last, default=str)),
                        "names": [k for k, v in globals().items() if v is _bench_e and not k.startswith("_")]})
print("BENCH-JSON " + _bench_json.dumps(_bench_info))
"""

# Puts explorer k's first slider at its minimum (from code, drawn at once) and prints how many frames it has drawn.
DRAG_START = r"""
_bench_e = _bench_found[{k}][0]
_bench_name, _bench_w = next(iter(_bench_e.controls.items()))
_bench_opts = list(getattr(_bench_w, "_options_values", None) or [])
_bench_e.set(**{{_bench_name: _bench_opts[0] if _bench_opts else
                 ((_bench_w.value[0], _bench_w.min) if isinstance(_bench_w.value, tuple) else _bench_w.min)}})
print("BENCH-JSON " + str(len(_bench_e.stage_ms)))
"""

# The stage records of explorer k from record n0 on (each with its start on the monotonic clock and its wait).
DRAG_STAGES = r"""
import json as _bench_json
print("BENCH-JSON " + _bench_json.dumps(_bench_found[{k}][0].stage_ms[{n0}:]))
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


def _kernel_json(kc, code: str, timeout: float = 600):
    """Run ``code`` in the kernel of ``kc``; return the JSON it printed after ``BENCH-JSON`` (errors raise)."""
    out, err = [], []

    def hook(msg):
        kind, content = msg["header"]["msg_type"], msg["content"]
        if kind == "stream":
            out.append(content["text"])
        elif kind == "error":
            err.append("\n".join(content["traceback"]))

    kc.execute_interactive(code, timeout=timeout, output_hook=hook)
    if err:
        raise RuntimeError(err[0])
    for line in "".join(out).splitlines():
        if line.startswith("BENCH-JSON "):
            return json.loads(line[len("BENCH-JSON "):])
    return None


def _drag_value(info: dict, fraction: float):
    """The value (and the state message) the slider takes with the pointer at ``fraction`` of its track."""
    f = min(1.0, max(0.0, fraction))
    if info["n_options"]:
        index = round(f * (info["n_options"] - 1))
        return index, {"index": index}
    lo, hi, step = info["min"], info["max"], info["step"]
    v = min(hi, lo + round(f * (hi - lo) / step) * step)
    v = int(v) if all(isinstance(x, int) for x in (lo, hi, step)) else round(float(v), 10)
    value = [info["first"][0], v] if info["range"] else v
    return v, {"value": value}


def _same(a, b) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return abs(a - b) <= 1e-9 * max(1.0, abs(b))
    return a == b


def drag_explorer(kc, k: int, info: dict, n_moves: int = 40, move_ms: float = 40.0, overshoot: float = 0.1) -> dict:
    """Replay a drag across explorer ``k``'s first slider (module docstring, ``--drag``) and time its frames."""
    import html as _html
    import queue
    import re

    n0 = _kernel_json(kc, DRAG_START.format(k=k))
    time.sleep(0.5)
    while True:  # what the start left on iopub
        try:
            kc.get_iopub_msg(timeout=0.05)
        except queue.Empty:
            break
    final_key = info["n_options"] - 1 if info["n_options"] else (info["final"][1] if info["range"] else info["final"])
    moves, sends, frames = [], [], []
    pending, buffered, last_key = None, None, _drag_value(info, 0.0)[0]  # the slider starts at its minimum

    def send(state):
        msg = kc.session.msg("comm_msg", {"comm_id": info["model_id"],
                                          "data": {"method": "update", "state": state, "buffer_paths": []}})
        kc.shell_channel.send(msg)
        sends.append(time.monotonic())
        return msg["header"]["msg_id"]

    def handle(msg):
        nonlocal pending, buffered
        kind, content = msg["header"]["msg_type"], msg["content"]
        if kind == "status" and content["execution_state"] == "idle" and msg["parent_header"].get("msg_id") == pending:
            pending = None
            if buffered is not None:
                pending, buffered = send(buffered), None
        elif kind == "comm_msg" and content["comm_id"] == info["timing_id"]:
            span = content["data"].get("state", {}).get("value", "")
            m = re.search(r'data-values="([^"]*)"', span)
            if m:
                frames.append((time.monotonic(), json.loads(_html.unescape(m.group(1)))[0]))

    def pump(until: float):
        while True:
            left = until - time.monotonic()
            if left <= 0:
                return
            try:
                handle(kc.get_iopub_msg(timeout=left))
            except queue.Empty:
                return

    t0 = time.monotonic()
    for i in range(1, n_moves + 1):
        pump(t0 + i * move_ms / 1e3)
        key, state = _drag_value(info, (1 + overshoot) * i / n_moves)
        moves.append((time.monotonic(), key))
        if key != last_key:  # the slider sends only a changed value
            last_key = key
            if pending is None:
                pending = send(state)
            else:
                buffered = state  # merged: only the latest waits
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # until the final frame is in and 0.8 s have passed without a new one
        pump(time.monotonic() + 0.1)
        done = frames and _same(frames[-1][1], info["final"][1] if info["range"] else info["final"])
        if done and pending is None and time.monotonic() - frames[-1][0] > 0.8:
            break
    final = info["final"][1] if info["range"] else info["final"]
    t_reach = next(t for t, key in moves if key == final_key)
    t_final = next((t for t, v in frames if t >= t_reach and _same(v, final)), float("nan"))
    stages = [r for r in _kernel_json(kc, DRAG_STAGES.format(k=k, n0=n0)) if r.get("start", 0) >= t0 - 0.01]
    after = [r for r in stages if r["start"] + r["total"] / 1e3 >= t_reach]  # frames that ended after that move
    return {"cell": info["cell"], "names": info["names"], "control": info["control"], "moves": n_moves,
            "move_ms": move_ms, "sends": len(sends), "frames": len(frames),
            "final_ms": (t_final - t_reach) * 1e3, "frames_after": len([t for t, _ in frames if t > t_reach]),
            "stages": stages, "after": [{"start_ms": (r["start"] - t_reach) * 1e3, "queued": r["queued"],
                                         "total": r["total"], "render": r["render"]} for r in after]}


def drag_notebook(path: Path, n_moves: int = 40, move_ms: float = 40.0, timeout: int = 600) -> list[dict]:
    """Start a kernel, run the cells ``path``'s explorers need, and replay a drag across each explorer's first slider."""
    from jupyter_client.manager import start_new_kernel

    nb = json.loads(path.read_text(encoding="utf-8"))
    explorers, needed = _needed_cells(nb)
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    km, kc = start_new_kernel(kernel_name="python3", cwd=str(path.parent))
    try:
        for i in needed:
            _kernel_json(kc, "".join(code[i]["source"]), timeout)
            if i in explorers:
                _kernel_json(kc, REGISTER.replace("{cell}", str(i)), timeout)
        infos = _kernel_json(kc, DRAG_INFO, timeout)
        return [drag_explorer(kc, k, info, n_moves, move_ms) for k, info in enumerate(infos)]
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def drag_table(results: dict[str, list[dict]]) -> list[str]:
    lines = ["| explorer | first slider | frames drawn (values sent) | final frame after the move that reached the "
             "final value, ms | frames that ended after that move: start after it / waited on the timer / drew (render), ms |",
             "|---|---|---|---|---|"]
    for nb, found in results.items():
        for r in found:
            name = f"{nb[:2]} `{r['names'][0] if r['names'] else 'explorer'}`"
            after = "; ".join(f"{a['start_ms']:+.0f} / {a['queued']:.0f} / {a['total']:.0f} ({a['render']:.0f})"
                              for a in r["after"])
            lines.append(f"| {name} | {r['control']} | {r['frames']} ({r['sends']}) | {r['final_ms']:.0f} | {after} |")
    return lines


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
    ap.add_argument("--drag", action="store_true", help="replay a drag across each explorer's first slider instead")
    ap.add_argument("--drags", type=int, default=1, help="with --drag: drags per explorer (default 1)")
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
        if args.drag:
            results[p.name] = [r for _ in range(args.drags) for r in drag_notebook(p)]
        else:
            results[p.name] = measure_notebook(p, args.moves)
        print(f"  {p.name}: {len(results[p.name])} {'drag(s)' if args.drag else 'explorer(s)'}, "
              f"{time.perf_counter() - t:.0f} s", flush=True)
    lines = (header + [f"load average at end {os.getloadavg()[0]:.2f}; {time.perf_counter() - t0:.0f} s in all", ""]
             + (drag_table(results) if args.drag else table(results)))
    print("\n".join(lines[1:]))
    if args.save:
        out = REPO / "benchmarks" / "results" / f"explorer_latency_{_dt.date.today():%Y-%m-%d}.txt"
        with open(out, "a", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n\n")
        print(f"appended to {out.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
