"""The slider-explorer machinery every notebook uses.

The numerical modules (``rope``, ...) never plot. An explorer is built from

* a **pure function** ``compute(**values) -> dict`` that does all the numbers (tests and
  notebooks call it directly, without a browser), and
* a **draw** function that only moves existing matplotlib artists to the new state.

:class:`Explorer` wires the two to ipywidgets sliders. Its figure is created once (a
``matplotlib.figure.Figure``, not pyplot, so nothing is displayed twice) and every slider
move re-renders it to PNG into an ``ipywidgets.Image``: no figure is re-created, so a
redraw takes tens of milliseconds. ``explorer.last_ms`` holds the time of the last update
(compute + draw + render), and ``explorer.state`` the last computed dict.

Readable where no kernel runs
-----------------------------
A learner often first reads a notebook on GitHub, in nbviewer or in an HTML export, where no
kernel runs and a bare widget is an empty box. So displaying an explorer publishes **one output
whose mime bundle carries three representations** (:meth:`Explorer._repr_mimebundle_`):

* ``application/vnd.jupyter.widget-view+json``: the live sliders;
* ``image/png``: the figure as it is when displayed (its initial state), the same bytes the
  widget shows;
* ``text/plain``: one stable line naming the explorer's settings.

Each front end picks one of them:

* **JupyterLab 4.6, cells run**: outputs from a live kernel are trusted, and the rendermime
  registry then takes the highest-ranked renderer present, the widget view (rank -10, ahead
  of ``image/png``): the live explorer. (``preferredMimeType(data, trusted ? 'any' :
  'ensure')`` in ``@jupyterlab/outputarea``; read in the installed 4.6 bundle.)
* **JupyterLab, notebook opened without running it**: a cloned or downloaded notebook is not
  trusted (``nbconvert --execute`` does not sign it); ``'ensure'`` allows only *safe*
  renderers, and ``@jupyter-widgets/jupyterlab-manager`` registers its widget renderer with
  ``safe: false``, so the PNG is shown (before this bundle: the ``text/plain`` line
  ``VBox(children=(HBox(...``). Only a notebook the reader has signed (``jupyter trust``)
  takes the widget renderer there, and it prints "Error displaying widget: model not found"
  until the cells run, because the saved state no longer holds the explorer (below); with the
  full saved state it restored a frozen copy of the sliders in their *last* position, moved by
  the notebook's later cells. All three cases were observed in JupyterLab 4.6.6 with
  jupyterlab_widgets 3.0.17 in headless Chromium.
* **nbconvert's HTML export (and nbviewer, which uses it)**: ``WidgetsDataTypeFilter`` puts
  the widget view first but skips it when its ``model_id`` is not in the notebook's saved
  widget state (``metadata.widgets["application/vnd.jupyter.widget-state+json"]["state"]``);
  the next format present is the PNG.
* **GitHub** needs ``metadata.widgets`` to hold a ``state`` key when it exists at all; what
  it draws for a widget view beside a PNG was not tested here.

nbclient (``jupyter nbconvert --execute``) saves the state of every live widget model at the
end of a run, so the HTML export would pick the widget view (an empty placeholder without the
widget JavaScript). ``python -m helpers.notebook_tools finalize NOTEBOOK`` therefore removes
from the saved state the models of every widget view that carries a static picture (the
explorer's box and everything only it uses: sliders, labels, layouts, the PNG buffer of its
``Image``), keeping the ``widgets`` entry and its ``state`` key. Chosen over running with
``--ExecutePreprocessor.store_widget_state=False``: that leaves a stale ``widgets`` entry from
an earlier run in place (nbclient only writes the entry when it saw widgets) and would also
drop the state of any widget shown without a picture. ``tests/test_static_figures.py``
exports every committed notebook with nbconvert's ``HTMLExporter`` and fails on an explorer
cell that does not render as an ``<img>``.
"""
from __future__ import annotations

import base64
import io
import time
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np
import PIL.Image
from matplotlib.figure import Figure

__all__ = ["Explorer", "FIGSIZE"]

#: The house figure size (inches) for single figures in notebooks.
FIGSIZE = (6.0, 3.5)


class Explorer:
    """Sliders + a figure that is redrawn (not re-created) on every change.

    Args:
        controls: ordered mapping ``name -> ipywidgets`` value widget; ``compute`` is
            called with ``{name: widget.value}``.
        compute: pure function returning a dict (the explorer's state).
        draw: ``draw(state)`` updates the artists of ``figure`` (no new axes).
        figure: the ``matplotlib.figure.Figure`` that ``draw`` updates.
        summary: ``summary(state) -> str`` shown in a label under the sliders (and used
            by tests to see the new value).
        dpi: PNG resolution.
        animated: optional list of the artists that ``draw`` changes. When given, the rest of
            the figure (axes, ticks, labels: most of the rendering time) is rendered once and
            kept as a background; each update only restores it and draws these artists
            ("blitting"). ``draw`` must then leave everything else, axis limits included,
            unchanged.
    """

    def __init__(
        self,
        controls: Mapping[str, Any],
        compute: Callable[..., dict],
        draw: Callable[[dict], None],
        figure: Figure,
        summary: Callable[[dict], str],
        dpi: int = 80,
        animated: Optional[Sequence[Any]] = None,
    ) -> None:
        import ipywidgets as widgets

        self.controls = dict(controls)
        self.compute = compute
        self.draw = draw
        self.figure = figure
        self.summary = summary
        self.dpi = dpi
        self.animated = list(animated) if animated else []
        self._background = None
        if self.animated:
            from matplotlib.backends.backend_agg import FigureCanvasAgg

            FigureCanvasAgg(figure)
            figure.set_dpi(dpi)
            for artist in self.animated:
                artist.set_animated(True)
        self.image = widgets.Image(format="png")
        self.image.add_class("explorer-figure")
        self.label = widgets.HTML()
        self.label.add_class("explorer-summary")
        self.state: dict = {}
        self.last_ms = float("nan")
        self.times_ms: list[float] = []
        for w in self.controls.values():
            w.observe(self._on_change, names="value")
        self.widget = widgets.VBox(
            [widgets.HBox(list(self.controls.values())[:3])]
            + ([widgets.HBox(list(self.controls.values())[3:])] if len(self.controls) > 3 else [])
            + [self.label, self.image]
        )
        self.widget.add_class("explorer")  # the browser tests find explorers by this class
        self.update()

    @property
    def values(self) -> dict:
        return {k: w.value for k, w in self.controls.items()}

    def _on_change(self, change) -> None:
        self.update()

    def update(self) -> dict:
        """Recompute, redraw, re-render; return the new state."""
        t0 = time.perf_counter()
        self.state = self.compute(**self.values)
        self.draw(self.state)
        self.image.value = self._render()
        self.label.value = self.summary(self.state)
        self.last_ms = (time.perf_counter() - t0) * 1e3
        self.times_ms.append(self.last_ms)
        return self.state

    def _render(self) -> bytes:
        buf = io.BytesIO()
        if not self.animated:
            self.figure.savefig(buf, format="png", dpi=self.dpi)
            return buf.getvalue()
        canvas = self.figure.canvas
        if self._background is None:
            canvas.draw()  # everything but the animated artists
            self._background = canvas.copy_from_bbox(self.figure.bbox)
        canvas.restore_region(self._background)
        for artist in self.animated:
            self.figure.draw_artist(artist)
        rgba = np.asarray(canvas.buffer_rgba())
        PIL.Image.fromarray(rgba[..., :3]).save(buf, format="png", compress_level=1)
        return buf.getvalue()

    def set(self, **values) -> dict:
        """Move sliders programmatically (as a learner would) and return the new state."""
        for k, v in values.items():
            if k not in self.controls:
                raise ValueError(f"unknown control {k!r}; controls are {list(self.controls)}")
        with self._hold():
            for k, v in values.items():
                self.controls[k].value = v
        return self.update()

    class _Hold:
        def __init__(self, ex):
            self.ex = ex

        def __enter__(self):
            for w in self.ex.controls.values():
                w.unobserve(self.ex._on_change, names="value")

        def __exit__(self, *exc):
            for w in self.ex.controls.values():
                w.observe(self.ex._on_change, names="value")

    def _hold(self):
        return Explorer._Hold(self)

    def text(self) -> str:
        """One stable line naming the explorer's settings (its ``text/plain`` form).

        Values are written with each slider's own readout format, so a float slider prints
        ``0.10``, not ``0.1000000000000001``.
        """
        settings = ", ".join(
            f"{getattr(w, 'description', '') or name}={_readout(w)}" for name, w in self.controls.items()
        )
        return f"Explorer: {settings} (a picture of this state; run the notebook in Jupyter to move the sliders)"

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        """The live widget view, a PNG of the current figure and a stable text line.

        Front ends that render widgets show the sliders; the others (GitHub, nbviewer,
        nbconvert's HTML export once the saved widget state no longer holds this explorer,
        JupyterLab for an untrusted notebook) show the PNG. See the module docstring.
        """
        data = dict(self.widget._repr_mimebundle_())
        if not self.image.value:  # cannot happen after __init__ (update() renders); be explicit
            self.image.value = self._render()
        data["image/png"] = base64.b64encode(bytes(self.image.value)).decode("ascii")
        data["text/plain"] = self.text()
        return data

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self._repr_mimebundle_(), raw=True)


def _readout(widget: Any) -> str:
    """A control's value as its readout shows it (``readout_format`` when it has one)."""
    value = widget.value
    fmt = getattr(widget, "readout_format", None)

    def one(v: Any) -> str:
        if fmt and isinstance(v, (int, float)) and not isinstance(v, bool):
            try:
                return format(v, fmt)
            except (TypeError, ValueError):
                return repr(v)
        return str(v)

    if isinstance(value, tuple):
        return "(" + ", ".join(one(v) for v in value) + ")"
    return one(value)


