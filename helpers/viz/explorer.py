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
"""
from __future__ import annotations

import io
import time
from typing import Any, Callable, Mapping

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
    """

    def __init__(
        self,
        controls: Mapping[str, Any],
        compute: Callable[..., dict],
        draw: Callable[[dict], None],
        figure: Figure,
        summary: Callable[[dict], str],
        dpi: int = 80,
    ) -> None:
        import ipywidgets as widgets

        self.controls = dict(controls)
        self.compute = compute
        self.draw = draw
        self.figure = figure
        self.summary = summary
        self.dpi = dpi
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
        buf = io.BytesIO()
        self.figure.savefig(buf, format="png", dpi=self.dpi)
        self.image.value = buf.getvalue()
        self.label.value = self.summary(self.state)
        self.last_ms = (time.perf_counter() - t0) * 1e3
        self.times_ms.append(self.last_ms)
        return self.state

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

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)


