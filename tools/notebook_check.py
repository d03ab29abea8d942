"""Check that committed notebooks read well where no kernel runs (GitHub, nbviewer, an HTML export).

Regenerate a notebook with::

    jupyter nbconvert --to notebook --execute --inplace --ExecutePreprocessor.store_widget_state=False notebooks/NN_name.ipynb

and check committed notebooks (what ``tests/test_static_figures.py`` asserts) with
``python tools/notebook_check.py notebooks/*.ipynb notebooks/appendix/*.ipynb``.

Why the flag
------------
An explorer (:class:`helpers.viz.explorer.Explorer`) displays one output carrying both its live
widget view and a PNG of its initial figure. nbconvert's HTML export, and nbviewer built on it,
show the widget view whenever its ``model_id`` is in the notebook's saved widget state
(``metadata.widgets["application/vnd.jupyter.widget-state+json"]["state"]``); without the
widget JavaScript that view is an empty placeholder. nbclient saves the state of every live
model at the end of ``--execute`` unless ``store_widget_state`` is off, so the flag keeps static
front ends on the picture. JupyterLab is not affected once the cells run: it uses the live
kernel's models. nbclient then writes no ``widgets`` entry; an entry kept from an earlier file
must still hold a ``state`` key (GitHub refuses to render a notebook whose ``widgets`` metadata
lacks it), and :func:`problems` reports one that holds an explorer's model.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import nbformat

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
#: mime types a static front end can show in place of a widget view
STATIC_PICTURES = ("image/png", "image/jpeg", "image/svg+xml")
#: the command that regenerates a committed notebook (``NN_name`` is a placeholder)
REGENERATE = ("jupyter nbconvert --to notebook --execute --inplace --ExecutePreprocessor.store_widget_state=False "
              "notebooks/NN_name.ipynb")


@dataclass(frozen=True)
class WidgetView:
    """One output that displays a widget view.

    ``cell`` and ``output`` index ``nb.cells`` and that cell's ``outputs``; ``picture`` is the
    first of :data:`STATIC_PICTURES` the same output carries, or ``None``.
    """

    cell: int
    output: int
    model_id: str
    picture: str | None


def _check_notebook(nb: object, name: str = "nb") -> None:
    if not isinstance(nb, nbformat.NotebookNode):
        raise TypeError(f"{name} must be a notebook (nbformat.NotebookNode, as nbformat.read returns), "
                        f"got {type(nb).__name__}")
    if not isinstance(nb.get("cells"), list):
        raise ValueError(f"{name} must have a list of cells (nbformat 4); got {type(nb.get('cells')).__name__}")


def widget_views(nb: nbformat.NotebookNode) -> list[WidgetView]:
    """Every output of a code cell whose mime bundle carries a widget view, in notebook order."""
    _check_notebook(nb)
    found = []
    for i, cell in enumerate(nb.cells):
        if cell.get("cell_type") != "code":
            continue
        for j, out in enumerate(cell.get("outputs", [])):
            data = out.get("data", {})
            view = data.get(WIDGET_VIEW)
            if isinstance(view, dict) and view.get("model_id"):
                picture = next((m for m in STATIC_PICTURES if m in data), None)
                found.append(WidgetView(i, j, view["model_id"], picture))
    return found


def saved_state(nb: nbformat.NotebookNode) -> dict | None:
    """``metadata.widgets[WIDGET_STATE]["state"]``; ``None`` when the notebook has no ``widgets`` entry.

    Raises:
        ValueError: the ``widgets`` entry exists but lacks the widget-state mime type or its
            ``state`` key (GitHub refuses to render such a notebook).
    """
    _check_notebook(nb)
    widgets = nb.metadata.get("widgets")
    if widgets is None:
        return None
    entry = widgets.get(WIDGET_STATE) if isinstance(widgets, dict) else None
    if not isinstance(entry, dict) or not isinstance(entry.get("state"), dict):
        raise ValueError(f"metadata.widgets must hold {WIDGET_STATE!r} with a 'state' dict when it exists "
                         f"(GitHub refuses to render the notebook otherwise); got {json.dumps(widgets)[:200]}")
    return entry["state"]


def problems(nb: nbformat.NotebookNode) -> list[str]:
    """What keeps a notebook's widgets from reading well without a kernel; empty when none.

    * the ``widgets`` metadata lacks its ``state`` (GitHub refuses to render the notebook);
    * a widget view without a static picture (this series' rule: every explorer leaves one);
    * a widget view with a picture whose model is in the saved state (nbconvert and nbviewer
      would draw the empty widget instead of the picture): regenerate with :data:`REGENERATE`.
    """
    found = []
    try:
        state = saved_state(nb) or {}
    except ValueError as err:
        found.append(str(err))
        state = {}
    for v in widget_views(nb):
        where = f"cell {v.cell} (output {v.output})"
        if v.picture is None:
            found.append(f"{where}: widget view without a static picture ({', '.join(STATIC_PICTURES)}); "
                         "display explorers through helpers.viz.Explorer")
        elif v.model_id in state:
            found.append(f"{where}: the widget's model is in the saved widget state, so nbconvert/nbviewer show "
                         f"an empty widget instead of its {v.picture}; regenerate with: {REGENERATE}")
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python tools/notebook_check.py",
        description="List what keeps explorers from reading well without a kernel; exit status 1 if anything.",
    )
    parser.add_argument("paths", nargs="+", help="committed .ipynb notebooks")
    args = parser.parse_args(argv)
    status = 0
    for path in args.paths:
        try:
            if Path(path).suffix != ".ipynb":
                raise ValueError(f"path must name a .ipynb notebook; got {path!r}")
            if not Path(path).is_file():
                raise ValueError(f"path must name an existing notebook file; {path!r} does not exist")
            found = problems(nbformat.read(path, as_version=4))
            print(f"{path}: " + ("ok" if not found else "\n  " + "\n  ".join(found)))
            status |= bool(found)
        except (ValueError, TypeError, OSError) as err:
            print(f"{path}: error: {err}", file=sys.stderr)
            status = 2
    return status


if __name__ == "__main__":
    sys.exit(main())
