"""Explorers are readable where no kernel runs (GitHub, nbviewer, an HTML export).

Every explorer displays one output carrying its live widget view, a PNG of its initial figure
and a stable text line (``helpers.viz.explorer``). Notebooks are regenerated with
``--ExecutePreprocessor.store_widget_state=False`` (``tools/notebook_check.py``), so no explorer's model is in
the saved widget state and static front ends fall back to the PNG. Here:

* every committed notebook's explorer cells are exported with nbconvert's ``HTMLExporter`` (in-process,
  no execution), with the notebook's metadata (its saved widget state), and each must show its PNG as an
  ``<img>``, not a widget placeholder. The exporter renders a cell from the cell and the notebook's
  metadata only, so these cells come out as in the whole notebook's export (checked on one notebook);
  exporting only them skips the prose and code cells, most of the export's time;
* ``metadata.widgets``, when present, keeps its ``state`` key (GitHub refuses the notebook otherwise);
* the bundle itself, and the whole pipeline on a tiny notebook executed by nbclient (the same
  executor as ``jupyter nbconvert --execute``): with the widget state saved, the export shows no
  picture (the failure this file guards against); executed without it, it does.
"""
from __future__ import annotations

import base64
import copy
import io
import json
import re
from pathlib import Path

import nbformat
import pytest

import notebook_check as nt  # tools/notebook_check.py (tools/ is on sys.path: root conftest.py)
from pristine import pristine  # tools/pristine.py: the committed copy of a notebook the learner edited

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb")) + sorted((REPO / "notebooks" / "appendix").glob("[0-9][0-9]*_*.ipynb"))
VIEW = "application/vnd.jupyter.widget-view+json"
STATE = "application/vnd.jupyter.widget-state+json"


def _explorer_outputs(nb):
    """(cell, output) of every output displaying a widget view; in this series every widget is an explorer."""
    return [(cell, out) for cell in nb.cells if cell.cell_type == "code"
            for out in cell.get("outputs", []) if VIEW in out.get("data", {})]


def _html(path_or_nb) -> str:
    """nbconvert's HTML export (lab template, as ``jupyter nbconvert --to html``)."""
    from nbconvert import HTMLExporter

    exporter = HTMLExporter()
    if isinstance(path_or_nb, Path):
        return exporter.from_filename(str(path_or_nb))[0]
    return exporter.from_notebook_node(path_or_nb)[0]


def _html_of_cells(nb, cells, path: Path) -> str:
    """The HTML export of ``cells`` alone, with ``nb``'s metadata (its saved widget state decides whether an
    output renders as a widget view) and the resources ``from_filename`` passes for ``path``."""
    from nbconvert import HTMLExporter

    keep = {id(cell) for cell in cells}
    part = nbformat.from_dict({**nb, "metadata": copy.deepcopy(nb.metadata),
                               "cells": [copy.deepcopy(cell) for cell in nb.cells if id(cell) in keep]})
    resources = {"metadata": {"name": path.stem, "path": str(path.parent)}}
    return HTMLExporter().from_notebook_node(part, resources=resources)[0]


def _pictures_in_cell(html: str, cell):
    """(PNG payloads shown as <img>, widget-view placeholders) inside the exported cell."""
    from bs4 import BeautifulSoup

    anchor = html.find(f'id="cell-id={cell.id}"')
    assert anchor >= 0, f"cell {cell.id} not found in the HTML export"
    start = html.rfind("<div", 0, anchor)
    following = html.find('id="cell-id=', anchor + 1)  # parse this cell only (a whole page takes ~1 s)
    end = html.rfind("<div", 0, following) if following >= 0 else len(html)
    div = BeautifulSoup(html[start:end], "html.parser")
    imgs = [img["src"].split(",", 1)[1] for img in div.find_all("img")
            if img.get("src", "").startswith("data:image/png;base64,")]
    widgets = div.find_all("script", attrs={"type": VIEW})
    return imgs, widgets


# ---------------------------------------------------------------- committed notebooks


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 7


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_widget_metadata_keeps_its_state(path: Path):
    nb = nbformat.read(pristine(path), as_version=4)
    widgets = nb.metadata.get("widgets")
    if widgets is not None:  # GitHub: "the 'state' key is missing from 'metadata.widgets'"
        assert isinstance(widgets.get(STATE, {}).get("state"), dict), (
            f"{path.name}: metadata.widgets lacks {STATE}.state; GitHub refuses to render it")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_html_export_shows_every_explorer_as_a_picture(path: Path):
    nb = nbformat.read(pristine(path), as_version=4)
    explorers = _explorer_outputs(nb)
    # Every lesson has an Explore section; an appendix notebook (evidence behind a lesson) may have none,
    # and neither has 00_daily_practice, the practice notebook: it is not a lesson (no sliders, no Exercises).
    assert explorers or path.parent.name == "appendix" or path.stem == "00_daily_practice", (
        f"{path.name}: no explorer output (every notebook has an Explore section); "
        f"was it committed unexecuted? Regenerate with: {nt.REGENERATE}")
    cells = [cell for cell, _ in explorers]
    html = _html_of_cells(nb, cells, pristine(path)) if cells else ""
    for cell, out in explorers:
        where = f"{path.name}, cell {cell.id} ({cell.source.splitlines()[-1]!r})"
        png = out["data"].get("image/png")
        assert png, (f"{where}: the explorer output carries no image/png (displayed by an Explorer without "
                     f"_repr_mimebundle_?); regenerate with: {nt.REGENERATE}")
        imgs, placeholders = _pictures_in_cell(html, cell)
        assert png in imgs and not placeholders, (
            f"{where}: `jupyter nbconvert --to html` shows {len(placeholders)} widget placeholder(s) and "
            f"{len(imgs)} picture(s), not the explorer's PNG; the saved widget state still holds the explorer. "
            f"Regenerate with: {nt.REGENERATE}")
        import PIL.Image

        width, height = PIL.Image.open(io.BytesIO(base64.b64decode(png))).size
        assert width >= 200 and height >= 100, f"{where}: the picture is {width}x{height} px"
        assert out["data"]["text/plain"].startswith("Explorer: "), f"{where}: {out['data']['text/plain'][:80]!r}"
    assert nt.problems(nb) == []


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_whole_notebook_exports_to_html_with_every_explorer_as_a_picture(path: Path):
    """The full check's form of the test above: the whole notebook, prose and code cells too, through
    ``jupyter nbconvert --to html``'s exporter (a learner's export must not fail on any cell)."""
    nb = nbformat.read(pristine(path), as_version=4)
    html = _html(pristine(path))
    code_cells = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert all(f'id="cell-id={cell.id}"' in html for cell in code_cells), f"{path.name}: a code cell is missing"
    for cell, out in _explorer_outputs(nb):
        imgs, placeholders = _pictures_in_cell(html, cell)
        assert out["data"]["image/png"] in imgs and not placeholders, f"{path.name}, cell {cell.id}"


def test_explorer_cells_export_as_in_the_whole_notebooks_export():
    """What the test above rests on: an explorer cell exported alone (with the notebook's metadata) is the same
    HTML as in the export of its whole notebook. Checked on the smallest notebook that has an explorer."""
    for path in sorted(NOTEBOOKS, key=lambda p: pristine(p).stat().st_size):
        nb = nbformat.read(pristine(path), as_version=4)
        cells = [cell for cell, _ in _explorer_outputs(nb)]
        if cells:
            break
    whole, alone = _html(pristine(path)), _html_of_cells(nb, cells, pristine(path))

    def cell_html(html, cell):  # from this cell's <div> to the next cell's (the page's end for the last)
        anchor = html.find(f'id="cell-id={cell.id}"')
        following = html.find('id="cell-id=', anchor + 1)
        end = html.rfind("<div", 0, following) if following >= 0 else html.find("</main>", anchor)
        return html[html.rfind("<div", 0, anchor):end].strip()  # the whitespace before the next cell varies

    for cell in cells:
        assert whole.find(f'id="cell-id={cell.id}"') >= 0 and alone.find(f'id="cell-id={cell.id}"') >= 0
        assert cell_html(alone, cell) == cell_html(whole, cell), f"{path.name}, cell {cell.id}"


# ---------------------------------------------------------------- the bundle


TINY_EXPLORER = """
import ipywidgets as widgets
from matplotlib.figure import Figure

from helpers.viz.explorer import FIGSIZE, Explorer

fig = Figure(figsize=FIGSIZE)
ax = fig.add_subplot()
(line,) = ax.plot([0, 1], [0, 0.1])
ax.set(xlim=(0, 1), ylim=(0, 1), title="a line", xlabel="x", ylabel="y")
controls = {
    "a": widgets.FloatSlider(value=0.1, min=0.0, max=1.0, step=0.05, description="slope a", readout_format=".2f"),
    "span": widgets.IntRangeSlider(value=(2, 6), min=0, max=10, description="span"),
}
ex = Explorer(controls, lambda a, span: {"a": a, "span": span}, lambda s: line.set_ydata([0, s["a"]]),
              fig, lambda s: f"a = {s['a']:.2f}")
"""


def _tiny_explorer():
    namespace: dict = {}
    exec(TINY_EXPLORER, namespace)
    return namespace["ex"]


def test_bundle_carries_widget_view_current_png_and_stable_text():
    import PIL.Image

    ex = _tiny_explorer()
    bundle = ex._repr_mimebundle_()
    assert set(bundle) == {VIEW, "image/png", "text/plain"}
    assert bundle[VIEW]["model_id"] == ex.widget.model_id
    png = base64.b64decode(bundle["image/png"])
    assert png == bytes(ex.image.value)  # the picture the widget shows
    assert PIL.Image.open(io.BytesIO(png)).size == (480, 280)  # FIGSIZE (6 x 3.5 in) at dpi 80
    assert bundle["text/plain"] == ("Explorer: slope a=0.10, span=(2, 6) (a picture of this state; "
                                    "run the notebook in Jupyter to move the sliders)")
    json.dumps(bundle)  # what the kernel sends and nbformat stores: JSON, base64 text for the PNG

    ex.set(a=0.1 + 0.05)  # 0.15000000000000002: the text uses the slider's readout format
    moved = ex._repr_mimebundle_()
    assert moved["text/plain"].startswith("Explorer: slope a=0.15, span=(2, 6)")
    assert moved["image/png"] != bundle["image/png"]  # the picture follows the current figure


TINY_CELLS = [
    TINY_EXPLORER + "ex",
    "import ipywidgets as widgets\nplain = widgets.IntSlider(value=3, description='plain')\nplain",
]


def _execute_without_and_with_saved_state():
    """The two-cell notebook (an explorer, a plain slider) executed by nbclient, as `jupyter nbconvert --execute`
    does, with ``store_widget_state=False`` (the regeneration command's flag) and then with nbclient's default.

    The flag acts in the client: nbclient stores the widget messages it receives from the kernel, or not
    (``NotebookClient.handle_comm_msg``). So the two runs share one kernel, started fresh for the first (the
    flag's run); the second runs the same cells again in it (new widgets, new model ids). A kernel start with
    ``helpers`` imported is about 2 s of the test's time."""
    from jupyter_client.manager import AsyncKernelManager
    from jupyter_core.utils import run_sync
    from nbclient import NotebookClient

    km = AsyncKernelManager(kernel_name="python3")
    clients, executed = [], []
    try:
        for store_widget_state in (False, True):
            nb = nbformat.v4.new_notebook()
            nb.cells = [nbformat.v4.new_code_cell(src) for src in TINY_CELLS]
            clients.append(NotebookClient(nb, km=km, timeout=120, kernel_name="python3",
                                          store_widget_state=store_widget_state,
                                          resources={"metadata": {"path": str(REPO)}}))
            executed.append(clients[-1].execute())
    finally:
        for client in clients:
            if client.kc is not None:
                client.kc.stop_channels()
        if km.has_kernel:
            run_sync(km.shutdown_kernel)(now=True)
    return executed


def test_executing_without_saved_widget_state_gives_a_picture(tmp_path):
    done, raw = _execute_without_and_with_saved_state()
    # negative control: with the state saved (nbclient's default), the export shows the empty widget
    (cell, out), (plain_cell, plain_out) = _explorer_outputs(raw)
    assert out.output_type == "display_data" and set(out.data) == {VIEW, "image/png", "text/plain"}
    assert out.data[VIEW]["model_id"] in raw.metadata.widgets[STATE]["state"]
    imgs, placeholders = _pictures_in_cell(_html(raw), cell)
    assert imgs == [] and len(placeholders) == 1
    # and so does the explorer cell exported alone, as test_html_export_shows_every_explorer_as_a_picture does it
    imgs, placeholders = _pictures_in_cell(_html_of_cells(raw, [cell], tmp_path / "tiny.ipynb"), cell)
    assert imgs == [] and len(placeholders) == 1
    assert any("saved widget state" in p for p in nt.problems(raw))

    # the regeneration command's flag: no state is saved, the export shows the explorer's PNG
    assert "--ExecutePreprocessor.store_widget_state=False" in nt.REGENERATE
    assert "widgets" not in done.metadata
    (cell, out), (plain_cell, plain_out) = _explorer_outputs(done)
    html = _html(done)
    imgs, placeholders = _pictures_in_cell(html, cell)
    assert imgs == [out.data["image/png"]] and placeholders == []
    # a widget without a picture is left with its text line only (no state to draw it from): the check names it
    imgs, placeholders = _pictures_in_cell(html, plain_cell)
    assert imgs == [] and placeholders == []
    assert nt.problems(done) == ["cell 1 (output 0): widget view without a static picture (image/png, image/jpeg, "
                                 "image/svg+xml); display explorers through helpers.viz.Explorer"]


# ---------------------------------------------------------------- the check on hand-made states


def _model(refs=(), **extra):
    return {"model_name": "M", "model_module": "m", "model_module_version": "1",
            "state": {"children": [f"IPY_MODEL_{r}" for r in refs], **extra}}


def _nb(views, state):
    """A notebook with one code cell per view (model_id, picture?) and the given saved state."""
    nb = nbformat.v4.new_notebook()
    for model_id, picture in views:
        data = {VIEW: {"version_major": 2, "version_minor": 0, "model_id": model_id}, "text/plain": "x"}
        if picture:
            data["image/png"] = "iVBORw0KGgo="
        nb.cells.append(nbformat.v4.new_code_cell("x", outputs=[nbformat.v4.new_output("display_data", data=data)]))
    if state is not None:
        nb.metadata.widgets = {STATE: {"state": state, "version_major": 2, "version_minor": 0}}
    return nb


def test_errors_name_the_argument_and_rule():
    with pytest.raises(TypeError, match=r"nb must be a notebook \(nbformat.NotebookNode.*got dict"):
        nt.problems({"cells": []})
    broken = _nb([("box", True)], None)
    assert nt.problems(broken) == []  # no widgets entry at all: fine
    broken.metadata.widgets = {STATE: {"version_major": 2}}
    with pytest.raises(ValueError, match=r"metadata.widgets must hold .*widget-state\+json' with a 'state' dict"):
        nt.saved_state(broken)
    assert nt.problems(broken)[0].startswith("metadata.widgets must hold")


def test_cli_errors_name_the_path_and_rule(tmp_path, capsys):
    assert nt.main([str(tmp_path / "notes.md")]) == 2
    assert re.search(r"path must name a .ipynb notebook; got '.*notes.md'", capsys.readouterr().err)
    assert nt.main([str(tmp_path / "missing.ipynb")]) == 2
    assert re.search(r"path must name an existing notebook file; '.*missing.ipynb' does not exist",
                     capsys.readouterr().err)


def test_cli_check_fails_on_a_saved_explorer_state(tmp_path, capsys):
    path = tmp_path / "n.ipynb"
    nbformat.write(_nb([("box", True)], {"box": _model()}), path)
    assert nt.main([str(path)]) == 1
    assert "regenerate with: jupyter nbconvert" in capsys.readouterr().out
    nbformat.write(_nb([("box", True)], {}), path)
    assert nt.main([str(path)]) == 0
    assert nt.main([str(tmp_path / "missing.ipynb")]) == 2
    assert "does not exist" in capsys.readouterr().err
