"""Finalize executed notebooks so that their explorers are readable where no kernel runs.

Not taught by a notebook: this is the series' tooling for regenerating the committed
notebooks. Regenerate a notebook with::

    jupyter nbconvert --to notebook --execute --inplace notebooks/NN_name.ipynb && python -m helpers.notebook_tools finalize notebooks/NN_name.ipynb

and check committed notebooks (what ``tests/test_static_figures.py`` asserts) with
``python -m helpers.notebook_tools check notebooks/*.ipynb``.

Why a finalizing step
---------------------
An explorer (:class:`helpers.viz.explorer.Explorer`) displays one output carrying both its live
widget view and a PNG of its initial figure. nbconvert's HTML export, and nbviewer built on it,
show the widget view whenever its ``model_id`` is in the notebook's saved widget state
(``metadata.widgets["application/vnd.jupyter.widget-state+json"]["state"]``), and nbclient saves
the state of every live model at the end of ``--execute``. :func:`finalize` removes from that
state the models of each widget view that carries a static picture (``image/png``,
``image/jpeg`` or ``image/svg+xml``), together with every model only they use (children,
layouts, styles, image buffers) and any model that refers to one of the removed ones (a
``jslink``), so static front ends fall back to the picture. Models used by a widget shown
without a picture are kept. The ``widgets`` entry and its ``state`` key stay (GitHub refuses to
render a notebook whose ``widgets`` metadata lacks ``state``); the state may become empty.
JupyterLab is not affected once the cells run: the live kernel's models are used, not the saved
ones. The trade-offs are in :mod:`helpers.viz.explorer`'s docstring.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import nbformat

__all__ = [
    "WIDGET_VIEW", "WIDGET_STATE", "STATIC_PICTURES", "REGENERATE",
    "WidgetView", "FinalizeReport", "widget_views", "saved_state", "finalize", "problems", "main",
]

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
#: mime types a static front end can show in place of a widget view
STATIC_PICTURES = ("image/png", "image/jpeg", "image/svg+xml")
#: the command that regenerates a committed notebook (``NN_name`` is a placeholder)
REGENERATE = ("jupyter nbconvert --to notebook --execute --inplace notebooks/NN_name.ipynb"
              " && python -m helpers.notebook_tools finalize notebooks/NN_name.ipynb")


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


@dataclass
class FinalizeReport:
    """What :func:`finalize` changed: model ids removed from and left in the saved state."""

    views: list[WidgetView] = field(default_factory=list)
    pruned: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.pruned)

    def __str__(self) -> str:
        with_picture = sum(v.picture is not None for v in self.views)
        return (f"{len(self.views)} widget view(s), {with_picture} with a static picture; "
                f"removed {len(self.pruned)} model(s) from the saved widget state, {len(self.kept)} left")


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


def _references(state: dict) -> dict[str, set[str]]:
    """model id -> ids of the other saved models its state names (``IPY_MODEL_<id>``, ``model_id``)."""
    refs = {}
    for model_id, model in state.items():
        body = {k: v for k, v in model.items() if k != "buffers"} if isinstance(model, dict) else model
        text = json.dumps(body)
        refs[model_id] = {other for other in state if other != model_id and other in text}
    return refs


def _closure(roots: Iterable[str], refs: dict[str, set[str]]) -> set[str]:
    seen, todo = set(), [r for r in roots if r in refs]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(refs[m] - seen)
    return seen


def finalize(nb: nbformat.NotebookNode) -> FinalizeReport:
    """Remove from the saved widget state what static front ends should not draw (in place).

    Removed: every model reachable from a widget view that carries a static picture, except
    models also reachable from a view without one; then, repeatedly, any remaining model not
    needed by those views that refers to a removed one. Idempotent. A notebook without a
    ``widgets`` entry is left without one.
    """
    views = widget_views(nb)
    state = saved_state(nb)
    report = FinalizeReport(views=views)
    if state is None:
        return report
    refs = _references(state)
    keep = _closure((v.model_id for v in views if v.picture is None), refs)
    pruned = _closure((v.model_id for v in views if v.picture is not None), refs) - keep
    grew = True
    while grew:
        extra = {m for m, r in refs.items() if m not in pruned and m not in keep and r & pruned}
        pruned |= extra
        grew = bool(extra)
    for m in pruned:
        del state[m]
    report.pruned = sorted(pruned)
    report.kept = sorted(state)
    return report


def problems(nb: nbformat.NotebookNode) -> list[str]:
    """What keeps a notebook's widgets from reading well without a kernel; empty when none.

    * the ``widgets`` metadata lacks its ``state`` (GitHub refuses to render the notebook);
    * a widget view without a static picture (this series' rule: every explorer leaves one);
    * a widget view with a picture whose model is still in the saved state (nbconvert and
      nbviewer would draw the empty widget instead of the picture): run :func:`finalize`.
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
        prog="python -m helpers.notebook_tools",
        description="Make explorers readable without a kernel (see the module docstring).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("finalize", help="prune the saved widget state of widget views that carry a picture "
                                    "(run after `jupyter nbconvert --execute --inplace`)").add_argument("paths", nargs="+")
    sub.add_parser("check", help="list what keeps explorers from reading well without a kernel; "
                                 "exit status 1 if anything").add_argument("paths", nargs="+")
    args = parser.parse_args(argv)
    status = 0
    for path in args.paths:
        try:
            if args.command == "finalize" and Path(path).suffix != ".ipynb":
                raise ValueError(f"path must name a .ipynb notebook; got {path!r}")
            if not Path(path).is_file():
                raise ValueError(f"path must name an existing notebook file; {path!r} does not exist")
            nb = nbformat.read(path, as_version=4)
            if args.command == "finalize":
                report = finalize(nb)
                if report.changed:  # written back only when something changed
                    nbformat.validate(nb)
                    nbformat.write(nb, path)
                print(f"{path}: {report}")
            else:
                found = problems(nb)
                print(f"{path}: " + ("ok" if not found else "\n  " + "\n  ".join(found)))
                status |= bool(found)
        except (ValueError, TypeError, OSError) as err:
            print(f"{path}: error: {err}", file=sys.stderr)
            status = 2
    return status


if __name__ == "__main__":
    sys.exit(main())
