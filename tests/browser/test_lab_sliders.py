"""Every notebook's explorers, run in a real JupyterLab in headless Chromium: no cell they need may
error, and every explorer's sliders (keyboard and mouse) must redraw its figure and show the new value.

nbval cannot see any of this: it skips widget views and images. nbval already runs every cell of
every notebook in the same kind of kernel, so here JupyterLab runs only the cells the explorers need:
the setup cell, each explorer cell, and, transitively, the last earlier cell that defines each name
they read (``cells_the_explorers_need``; a missed dependency shows as an error in an explorer cell,
so it cannot pass silently). That keeps the README's one test command within its time budget. Latencies (key press or drag
-> new figure in the page) are measured and reported, not asserted beyond a generous limit that
only catches a hang; the target is a median <= 300 ms. Screenshots of every explorer before and
after each move are taken into a folder under pytest's temporary directory that is kept, and
named in the failure report, only when the test fails (``conftest.screenshot_dir``).
"""
from __future__ import annotations

import ast
import builtins
import json
import re
import statistics
import time
from pathlib import Path

import pytest

from .conftest import REPORT

REPO = Path(__file__).resolve().parents[2]
# The lessons with explorers: the practice notebook (00) has none, and the appendix notebooks (evidence, no
# sliders) are re-executed by nbval like every notebook.
NOTEBOOKS = [p for p in sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb")) if p.stem != "00_daily_practice"]
HANG_MS = 10_000  # a redraw slower than this is a failure, not a latency

KERNEL_IDLE = """() => {
  const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
  return !!k && k.connectionStatus === 'connected' && k.status === 'idle';
}"""
RUN_CELLS = """async (indices) => {
  const app = window.jupyterapp, panel = app.shell.currentWidget;
  const code = panel.content.widgets.map((c, i) => [c, i]).filter(([c]) => c.model.type === 'code');
  for (const k of indices) {
    panel.content.activeCellIndex = code[k][1];
    await app.commands.execute('notebook:run-cell');
  }
}"""
EXECUTED = """(indices) => {
  const panel = window.jupyterapp.shell.currentWidget, k = panel.sessionContext.session.kernel;
  const code = panel.content.widgets.filter(c => c.model.type === 'code');
  return k.status === 'idle' && indices.every(i => code[i].model.executionCount !== null);
}"""
ERRORS = """() => {
  const w = window.jupyterapp.shell.currentWidget;
  const found = [];
  w.content.widgets.forEach((c, i) => {
    if (c.model.type !== 'code') return;
    for (const o of c.model.outputs.toJSON()) if (o.output_type === 'error') found.push(`cell ${i}: ${o.ename}: ${o.evalue}`);
  });
  return found;
}"""

DETAILS = """() => Array.from(document.querySelectorAll('.jp-MarkdownCell .jp-RenderedMarkdown details')).map(d => d.open)"""


def _defs_uses(source: str) -> tuple[set[str], set[str]]:
    """Names a cell binds (assignments, defs, imports) and names it reads (builtins left out)."""
    if source.lstrip().startswith("%%"):  # a cell magic's body is not Python for ast (e.g. %%submit)
        return set(), set()
    tree = ast.parse(source)
    defs, uses = set(), set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name):
            (defs if isinstance(n.ctx, (ast.Store, ast.Del)) else uses).add(n.id)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defs.add(n.name)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            defs |= {(a.asname or a.name).split(".")[0] for a in n.names}
    return defs, uses - set(dir(builtins))


def cells_the_explorers_need(nb: dict) -> tuple[list[int], list[int]]:
    """(explorer cells, every code cell they need, in order), as indices among the code cells.

    An explorer cell is one whose committed output holds a widget view. Needed: the setup cell (the
    first), the explorer cells, and for each name a needed cell reads, the last earlier cell that binds it."""
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    du = [_defs_uses("".join(c["source"])) for c in code]
    explorers = [i for i, c in enumerate(code)
                 if any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in c.get("outputs", []))]
    need, stack = {0, *explorers}, [0, *explorers]
    while stack:
        i = stack.pop()
        for name in du[i][1]:
            j = next((j for j in range(i - 1, -1, -1) if name in du[j][0]), None)
            if j is not None and j not in need:
                need.add(j)
                stack.append(j)
    return explorers, sorted(need)


def _open_and_run(page, lab, name: str, cells: list[int]) -> float:
    lab.delete_sessions()
    page.goto(f"{lab.url}/lab/tree/{name}?token={lab.token}&reset", wait_until="domcontentloaded")
    page.wait_for_function("() => !!window.jupyterapp && !!window.jupyterapp.shell.currentWidget && "
                           f"window.jupyterapp.shell.currentWidget.title.label === '{name}'", timeout=120_000)
    page.wait_for_function(KERNEL_IDLE, timeout=120_000)
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:clear-all-cell-outputs')")
    page.wait_for_function("() => window.jupyterapp.shell.currentWidget.content.widgets"
                           ".filter(c => c.model.type === 'code').every(c => c.model.executionCount === null)")
    t0 = time.perf_counter()
    page.evaluate(RUN_CELLS, cells)
    page.wait_for_timeout(300)  # let the first cell get queued before polling for idle
    page.wait_for_function(EXECUTED, arg=cells, timeout=300_000, polling=200)
    return time.perf_counter() - t0


def _wait_redraw(page, explorer, old_src: str) -> float:
    """Block until the explorer's figure differs from ``old_src``; return ms since the call."""
    t0 = time.perf_counter()
    explorer.locator("img.explorer-figure").evaluate(
        "(img, old) => new Promise((resolve, reject) => {"
        "  if (img.src !== old) return resolve();"
        "  const obs = new MutationObserver(() => { if (img.src !== old) { obs.disconnect(); resolve(); } });"
        "  obs.observe(img, {attributes: true, attributeFilter: ['src']});"
        f"  setTimeout(() => {{ obs.disconnect(); reject(new Error('no redraw within {HANG_MS} ms')); }}, {HANG_MS});"
        "})",
        old_src,
    )
    return (time.perf_counter() - t0) * 1e3


def _readout(handle) -> str:
    """The slider's displayed value (its readout box): what the learner reads."""
    return handle.locator("xpath=ancestor::div[contains(@class,'widget-slider')][1]").locator(".widget-readout").inner_text()


def _figure(explorer) -> str:
    return explorer.locator("img.explorer-figure").get_attribute("src")


def _summary(explorer) -> str:
    return explorer.locator(".explorer-summary").inner_text()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_and_explorers_respond(path, lab, browser, screenshot_dir):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        explorer_cells, cells = cells_the_explorers_need(json.loads(path.read_text(encoding="utf-8")))
        assert explorer_cells, f"{path.name}: no explorer found in the committed outputs"
        run_s = _open_and_run(page, lab, path.name, cells)
        errors = page.evaluate(ERRORS)
        assert not errors, f"{path.name}: cells with errors in JupyterLab: {errors}"
        folded = page.evaluate(DETAILS)
        n_details = sum(len(re.findall(r"^[ ]{0,3}<details\b", "".join(c["source"]), re.MULTILINE))
                        for c in json.loads(path.read_text(encoding="utf-8"))["cells"] if c["cell_type"] == "markdown")
        assert len(folded) == n_details and not any(folded), (
            f"{path.name}: {n_details} <details> blocks (hints, solutions) in its markdown, JupyterLab rendered "
            f"{len(folded)} with open = {folded}: each must be there and folded")
        shots = screenshot_dir

        explorers = page.locator(".explorer")
        n_explorers = explorers.count()
        assert n_explorers == len(explorer_cells), f"{path.name}: {n_explorers} explorers drawn, {len(explorer_cells)} expected"
        lines = [f"{path.name}: ran the {len(cells)} cells its explorers need in {run_s:.1f} s, {n_explorers} explorer(s)"]
        for e in range(n_explorers):
            explorer = explorers.nth(e)
            explorer.scroll_into_view_if_needed()
            page.wait_for_function("(el) => el.querySelector('img.explorer-figure').src.startsWith('blob:') || "
                                   "el.querySelector('img.explorer-figure').src.startsWith('data:')",
                                   arg=explorer.element_handle(), timeout=30_000)
            explorer.screenshot(path=str(shots / f"explorer{e}_0_before.png"))
            handles = explorer.locator(".widget-slider .noUi-handle")
            assert handles.count() >= 1, f"{path.name}: explorer {e} has no slider"
            latencies = []
            for h in range(handles.count()):
                handle = handles.nth(h)
                label = handle.locator("xpath=ancestor::div[contains(@class,'widget-slider')][1]").locator(".widget-label").inner_text()

                where = f"{path.name}: explorer {e}, slider {label!r}"
                # 1. keyboard: focus the handle, one step
                before_val = _readout(handle)
                at_max = float(handle.get_attribute("aria-valuenow")) >= float(handle.get_attribute("aria-valuemax"))
                old_src, old_summary = _figure(explorer), _summary(explorer)
                handle.focus()
                t0 = time.perf_counter()
                page.keyboard.press("ArrowLeft" if at_max else "ArrowRight")
                try:
                    _wait_redraw(page, explorer, old_src)
                except Exception as err:
                    raise AssertionError(f"{where}: no new figure after a key press ({before_val} -> {_readout(handle)}): {err}") from None
                latencies.append((time.perf_counter() - t0) * 1e3)
                after_val = _readout(handle)
                assert after_val != before_val, f"{where}: key press did not move it"
                page.wait_for_function("([el, old]) => el.querySelector('.explorer-summary').innerText !== old",
                                       arg=[explorer.element_handle(), old_summary], timeout=HANG_MS)
                assert _summary(explorer) != old_summary
                explorer.screenshot(path=str(shots / f"explorer{e}_slider{h}_key.png"))

                # 2. mouse: drag the handle a little way along its track
                box = handle.bounding_box()
                before_val = _readout(handle)
                at_max = float(handle.get_attribute("aria-valuenow")) >= float(handle.get_attribute("aria-valuemax"))
                old_src = _figure(explorer)
                x0, y0 = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
                page.mouse.move(x0, y0)
                page.mouse.down()
                t0 = time.perf_counter()
                direction = -1 if at_max else 1
                for dx in range(10, 400, 10):  # drag until the slider's value changes (any track length)
                    page.mouse.move(x0 + direction * dx, y0, steps=2)
                    if _readout(handle) != before_val:
                        break
                page.mouse.up()
                try:
                    _wait_redraw(page, explorer, old_src)
                except Exception as err:
                    raise AssertionError(f"{where}: no new figure after a drag ({before_val} -> {_readout(handle)}): {err}") from None
                latencies.append((time.perf_counter() - t0) * 1e3)
                assert _readout(handle) != before_val, f"{where}: drag did not move it"
                # the summary under the sliders names the slider's new value
                page.wait_for_timeout(100)
                explorer.screenshot(path=str(shots / f"explorer{e}_slider{h}_drag.png"))
            lines.append(
                f"  explorer {e}: {handles.count()} slider(s), key/drag -> new figure latency median "
                f"{statistics.median(latencies):.0f} ms, max {max(latencies):.0f} ms over {len(latencies)} moves (target median <= 300 ms)"
            )
        REPORT.extend(lines)
    finally:
        page.close()
