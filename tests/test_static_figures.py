"""Explorers are readable where no kernel runs (GitHub, nbviewer, an HTML export).

Every explorer displays one output carrying its live widget view, a PNG of its initial figure
and a stable text line (``helpers.viz.explorer``). Notebooks are regenerated with
``--ExecutePreprocessor.store_widget_state=False`` (``tools/notebook_check.py``), so no explorer's model is in
the saved widget state and static front ends fall back to the PNG. Here:

* every committed notebook is exported with nbconvert's ``HTMLExporter`` (in-process, no
  execution) and each explorer cell must show its PNG as an ``<img>``, not a widget placeholder;
* ``metadata.widgets``, when present, keeps its ``state`` key (GitHub refuses the notebook otherwise);
* the bundle itself, and the whole pipeline on a tiny notebook executed by nbclient (the same
  executor as ``jupyter nbconvert --execute``): with the widget state saved, the export shows no
  picture (the failure this file guards against); executed without it, it does.
"""
from __future__ import annotations

import base64
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
    html = _html(pristine(path))
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


def _execute(store_widget_state: bool):
    """The two-cell notebook (an explorer, a plain slider) executed by nbclient, as `jupyter nbconvert --execute` does."""
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in TINY_CELLS]
    NotebookClient(nb, timeout=120, kernel_name="python3", store_widget_state=store_widget_state,
                   resources={"metadata": {"path": str(REPO)}}).execute()
    return nb


def test_executing_without_saved_widget_state_gives_a_picture(tmp_path):
    # negative control: with the state saved (nbclient's default), the export shows the empty widget
    raw = _execute(store_widget_state=True)
    (cell, out), (plain_cell, plain_out) = _explorer_outputs(raw)
    assert out.output_type == "display_data" and set(out.data) == {VIEW, "image/png", "text/plain"}
    assert out.data[VIEW]["model_id"] in raw.metadata.widgets[STATE]["state"]
    imgs, placeholders = _pictures_in_cell(_html(raw), cell)
    assert imgs == [] and len(placeholders) == 1
    assert any("saved widget state" in p for p in nt.problems(raw))

    # the regeneration command's flag: no state is saved, the export shows the explorer's PNG
    assert "--ExecutePreprocessor.store_widget_state=False" in nt.REGENERATE
    done = _execute(store_widget_state=False)
    assert "widgets" not in done.metadata
    (cell, out), (plain_cell, plain_out) = _explorer_outputs(done)
    imgs, placeholders = _pictures_in_cell(_html(done), cell)
    assert imgs == [out.data["image/png"]] and placeholders == []
    # a widget without a picture is left with its text line only (no state to draw it from): the check names it
    imgs, placeholders = _pictures_in_cell(_html(done), plain_cell)
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
