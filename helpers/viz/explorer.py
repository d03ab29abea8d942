"""The slider-explorer machinery every notebook uses.

The numerical modules (``rope``, ...) never plot. An explorer is built from

* a **pure function** ``compute(**values) -> dict`` that does all the numbers (tests and
  notebooks call it directly, without a browser), and
* a **draw** function that only moves existing matplotlib artists to the new state.

:class:`Explorer` wires the two to ipywidgets sliders. Its figure is created once (a
``matplotlib.figure.Figure``, not pyplot, so nothing is displayed twice) and every slider
move re-renders it to PNG into an ``ipywidgets.Image``: no figure is re-created.

What one slider move costs
--------------------------
:meth:`Explorer.update` runs five stages and records their milliseconds in
``explorer.stage_ms`` (one dict per update; ``explorer.last_ms`` and ``explorer.times_ms`` hold
the totals): **compute** (the pure function), **draw** (artists moved), **render** (Agg),
**encode** (PNG) and **send** (the new PNG and summary handed to the widgets, which send them to
the browser over the kernel's comm). Each record also holds **queued** (the milliseconds the frame
waited on the coalescer's timer, 0 when it was drawn at once) and **start** (when it started, in
``time.monotonic()`` seconds, a clock every process on the machine shares). ``python
benchmarks/explorer_latency.py`` prints the stages for every explorer of the notebooks (with
``--drag``, the frames of a replayed drag), and the browser test (``tests/browser/test_lab_sliders.py``)
the time from a key press to the new figure in the page. What keeps them short (issue 34;
measured in CONTRIBUTING.md, "Explorer latency"):

* **Blitting.** An explorer that names the artists its ``draw`` moves (``animated=``) renders
  the rest of the figure once and keeps it as a background; an update restores it and draws only
  those artists. The background is keyed by every axes' limits: a move that changes them (a
  longer sequence, a wider range) needs a new one, and the last few are kept for moves back.
* **Moving axes.** An explorer whose limits follow a slider (02's cache, 08's tile map) names
  those axes (``ax.xaxis``, ``ax.yaxis``) among the animated artists. The rest of the figure is
  then rendered once, without them (the base), and a new set of limits only draws the moving axes
  (ticks, tick labels, axis label) over a copy of the base: no move renders the figure whole.
* **Text drawn once.** Text was most of the render time (matplotlib 3.11 rasterises every glyph
  of every label on every draw). The explorer's canvas (:class:`_TextCachingRenderer`) keeps
  the bitmap of each string it drew, placed on whole pixels as matplotlib did up to 3.9, so a
  title or a tick label is rasterised once per distinct string; the font's height metrics,
  which matplotlib re-reads from the font's tables for every string it lays out, once per font.
  A new string (a title with the slider's value) is laid out once, when matplotlib measures it,
  and its bitmap kept from that layout, where Agg laid it out again to draw it.
* **Compute on one torch thread.** torch splits an operation over 32768 elements over its thread
  pool, whose threads have gone to sleep between frames; waking them on a busy 2-core machine
  cost more than the operation (:func:`_one_torch_thread`).
* **Overlays.** Legends that never change (``overlays=``) are drawn once over each background
  and their pixels pasted back over the moving artists.
* **A cheap PNG.** Pillow's PNG encoder filters every row adaptively, which took about ten
  times as long as compressing; :func:`_png` writes the rows unfiltered and deflates them at
  level 1 (lossless, about the same size for these mostly white figures).
* **Coalescing.** While a slider is dragged the browser sends values faster than frames can be
  made. After each frame the kernel rests as long as that frame took, at most ``coalesce_ms``: a
  change from the browser is drawn at once when the rest has passed; otherwise only the latest
  values are drawn, once, at its end (a timer on the kernel's event loop). No queue of stale
  frames forms, and the frame after the last move shows its value (or the one after it, when the
  last move came in while a frame was being drawn). Changes made from code (``explorer.set(...)``,
  ``slider.value = ...`` in a cell) and every change where no event loop runs (tests, scripts)
  are drawn at once, so the new state can be read on the next line.

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
end of a run unless told not to, and the HTML export would then pick the widget view (an empty
placeholder without the widget JavaScript). The notebooks are therefore regenerated with
``--ExecutePreprocessor.store_widget_state=False`` (``tools/notebook_check.py``): no model is
saved, so every explorer falls back to its PNG. ``tests/test_static_figures.py``
exports every committed notebook with nbconvert's ``HTMLExporter`` and fails on an explorer
cell that does not render as an ``<img>``.
"""
from __future__ import annotations

import asyncio
import base64
import contextlib
import html
import json
import math
import struct
import sys
import time
import zlib
from collections import OrderedDict
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np
from matplotlib import rcParams
from matplotlib.axis import Axis
from matplotlib.backends.backend_agg import FigureCanvasAgg, RendererAgg, get_hinting_flag
from matplotlib.figure import Figure
from matplotlib.font_manager import fontManager, get_font
from matplotlib.transforms import Bbox

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
            ("blitting"), in this order. ``draw`` may change axis limits (the background is
            re-rendered for new limits), but nothing else outside these artists. An axis whose
            limits follow a slider (``ax.xaxis``, ``ax.yaxis``) may be listed too: it is then left
            out of the background and drawn, under the other animated artists, over a copy of it
            for each new set of limits, so a move that changes its limits needs no full draw (the
            other data artists of its axes must then be animated as well).
        overlays: optional list of artists that ``draw`` never changes but that must stay on
            top of the animated ones (legends). They are drawn once over each background and
            their pixels pasted back after the animated artists, so whatever moves beneath their
            bounding box is hidden there (a legend's frame, drawn at ``framealpha`` 0.8-0.9, let
            10-20% of it through). Only with ``animated``.
        coalesce_ms: while a slider is dragged, a frame starts no sooner after the end of the previous
            one than that frame took, nor later than this many milliseconds (module docstring, "Coalescing").
        rows: optional rows of control names, top to bottom (every control once); default: the
            first three controls in a row, the others in a second one.
    """

    #: backgrounds kept per explorer (one per set of axis limits recently shown)
    BACKGROUNDS = 8

    def __init__(
        self,
        controls: Mapping[str, Any],
        compute: Callable[..., dict],
        draw: Callable[[dict], None],
        figure: Figure,
        summary: Callable[[dict], str],
        dpi: int = 80,
        animated: Optional[Sequence[Any]] = None,
        overlays: Optional[Sequence[Any]] = None,
        coalesce_ms: float = 50.0,
        rows: Optional[Sequence[Sequence[str]]] = None,
    ) -> None:
        import ipywidgets as widgets

        self.controls = dict(controls)
        self.compute = compute
        self.draw = draw
        self.figure = figure
        self.summary = summary
        self.dpi = dpi
        self.animated = list(animated) if animated else []
        self.overlays = list(overlays) if overlays else []
        if self.overlays and not self.animated:
            raise ValueError("overlays are pasted over the animated artists: pass animated too")
        self._backgrounds: OrderedDict = OrderedDict()  # axis limits -> (background, overlay patches)
        self._bases: OrderedDict = OrderedDict()  # limits of the other axes -> the background without the moving axes
        self._moving_axes = [a for a in self.animated if isinstance(a, Axis)]  # drawn into each background
        self._moving = [a for a in self.animated if not isinstance(a, Axis)]  # drawn on every frame
        self._check_moving_axes()
        _ExplorerCanvas(figure)
        figure.set_dpi(dpi)
        for artist in self.animated + self.overlays:
            artist.set_animated(True)  # left out of the background
        self.image = widgets.Image(format="png")
        self.image.add_class("explorer-figure")
        self.label = widgets.HTML()
        self.label.add_class("explorer-summary")
        # hidden: the kernel's milliseconds and the control values of the last update (the browser test reads it)
        self.timing = widgets.HTML(layout=widgets.Layout(display="none"))
        self.timing.add_class("explorer-timing")
        self.state: dict = {}
        self.last_ms = float("nan")
        self.times_ms: list[float] = []
        self.stage_ms: list[dict[str, float]] = []
        self._coalescer = Coalescer(self.update, coalesce_ms / 1e3)
        for w in self.controls.values():
            w.observe(self._on_change, names="value")
        names = list(self.controls)
        if rows is None:
            rows = [names[:3]] + ([names[3:]] if len(names) > 3 else [])
        rows = [list(r) for r in rows]
        if sorted(n for r in rows for n in r) != sorted(names):
            raise ValueError(f"rows must name every control once; controls are {names}, rows {rows}")
        self.widget = widgets.VBox(
            [widgets.HBox([self.controls[n] for n in r]) for r in rows] + [self.label, self.image, self.timing]
        )
        self.widget.add_class("explorer")  # the browser tests find explorers by this class
        self.update()

    def _check_moving_axes(self) -> None:
        """An axes with an axis in ``animated`` may hold only animated data artists (the others would be drawn
        into its base once, at the limits it had then, and stay there when its limits change)."""
        moving = {id(a) for a in self.animated + self.overlays}
        for ax in {id(a.axes): a.axes for a in self._moving_axes}.values():
            if ax is None:
                raise ValueError("an axis in animated must belong to an axes of the figure")
            static = [a for a in [*ax.lines, *ax.images, *ax.collections, *ax.patches, *ax.texts, *ax.artists]
                      if id(a) not in moving and not any(a.get_transform() is t for t in (ax.transAxes, self.figure.transFigure))]
            if static:
                raise ValueError(f"an axis of this axes is animated (its limits move), so its data artists must be "
                                 f"animated too; not animated: {static[:3]}")

    @property
    def values(self) -> dict:
        return {k: w.value for k, w in self.controls.items()}

    def _on_change(self, change) -> None:
        # ipywidgets locks the properties a message from the browser sets while their observers run
        # (Widget.set_state: ``value``, or ``index`` for a selection slider); a change made by code in the kernel
        # has no lock and is drawn at once.
        if getattr(change.get("owner"), "_property_lock", None):
            self._coalescer.request()
        else:
            self.update()

    def update(self) -> dict:
        """Recompute, redraw, re-render, send; return the new state (stages in ``stage_ms``)."""
        queued_s = self._coalescer.queued_s  # how long this frame waited on the coalescer's timer (0: drawn at once)
        self._coalescer.cancel()  # a frame drawn now makes a pending one redundant
        start = time.monotonic()
        t0 = time.perf_counter()
        with _one_torch_thread():
            self.state = self.compute(**self.values)
        t1 = time.perf_counter()
        self.draw(self.state)
        t2 = time.perf_counter()
        rgba = self._render()
        t3 = time.perf_counter()
        png = _png(rgba)
        t4 = time.perf_counter()
        self.image.value = png
        self.label.value = self.summary(self.state)
        t5 = time.perf_counter()
        self.last_ms = (t5 - t0) * 1e3
        self.times_ms.append(self.last_ms)
        self.stage_ms.append({"compute": (t1 - t0) * 1e3, "draw": (t2 - t1) * 1e3, "render": (t3 - t2) * 1e3,
                              "encode": (t4 - t3) * 1e3, "send": (t5 - t4) * 1e3, "total": self.last_ms,
                              "queued": queued_s * 1e3, "start": start})
        values = html.escape(json.dumps(list(self.values.values()), default=str))
        self.timing.value = f'<span data-kernel-ms="{self.last_ms:.1f}" data-values="{values}"></span>'
        return self.state

    def _limits(self) -> tuple:
        return tuple((tuple(ax.get_xlim()), tuple(ax.get_ylim())) for ax in self.figure.axes)

    def _base_key(self, key: tuple) -> tuple:
        """``key`` (every axes' limits) without the limits of the axes in ``animated``: the key of the base."""
        moving = {id(a) for a in self._moving_axes}
        return tuple((None if id(ax.xaxis) in moving else x, None if id(ax.yaxis) in moving else y)
                     for ax, (x, y) in zip(self.figure.axes, key))

    def _render(self) -> np.ndarray:
        """Render the figure with Agg and return its ``(height, width, 4)`` RGBA pixels (a view)."""
        canvas = self.figure.canvas
        if not self.animated:
            canvas.draw()
            return np.asarray(canvas.buffer_rgba())
        key = self._limits()
        entry = self._backgrounds.get(key)
        if entry is None:
            entry = self._backgrounds[key] = self._background(key)  # left in the canvas
            while len(self._backgrounds) > self.BACKGROUNDS:
                self._backgrounds.popitem(last=False)
        else:
            self._backgrounds.move_to_end(key)
            canvas.restore_region(entry[0])
        for artist in self._moving:
            self.figure.draw_artist(artist)
        for patch in entry[1]:
            canvas.restore_region(patch)
        return np.asarray(canvas.buffer_rgba())

    def _background(self, key: tuple) -> tuple:
        """Render the background for the axis limits ``key`` into the canvas; return it with the overlays' patches.

        Without moving axes it is the figure drawn whole, less the animated artists and the overlays. With moving
        axes, that drawing (the base) does not depend on their limits: it is rendered once per limits of the other
        axes and kept, and each new ``key`` only draws the moving axes over it (a few ms, not a full draw).
        """
        canvas = self.figure.canvas
        base_key = self._base_key(key)
        base = self._bases.get(base_key) if self._moving_axes else None
        if base is None:
            canvas.draw()  # everything but the animated artists (moving axes included) and the overlays
            background = canvas.copy_from_bbox(self.figure.bbox)
            patches = []
            if self.overlays:
                renderer = canvas.get_renderer()
                for artist in self.overlays:
                    self.figure.draw_artist(artist)
                for artist in self.overlays:
                    box = Bbox.intersection(artist.get_window_extent(renderer).padded(2), self.figure.bbox)
                    if box is not None:
                        patches.append(canvas.copy_from_bbox(box))
                canvas.restore_region(background)
            base = (background, patches)
            if not self._moving_axes:
                return base
            self._bases[base_key] = base
            while len(self._bases) > self.BACKGROUNDS:
                self._bases.popitem(last=False)
        else:
            self._bases.move_to_end(base_key)
            canvas.restore_region(base[0])
        for axis in self._moving_axes:
            self.figure.draw_artist(axis)
        return canvas.copy_from_bbox(self.figure.bbox), base[1]

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
            self.image.value = _png(self._render())
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




@contextlib.contextmanager
def _one_torch_thread():
    """torch's intra-op threads set to one while an explorer computes, then restored.

    An explorer's compute runs small tensor operations. When one is large enough for torch to split it over its
    thread pool (32768 elements, e.g. the sin of 02's whole cache), the pool's thread has gone to sleep since the
    last frame and must be woken. On the 2-core machine at load average 3, with a 20 ms pause before each call,
    a sin and a cos of 257 x 128 float64 numbers took 3.7 ms median and 20 ms at worst on two threads, against
    0.24 ms on one, the switch included. Elementwise results do not depend on the thread count.
    """
    torch = sys.modules.get("torch")
    n = torch.get_num_threads() if torch is not None else 1
    if n <= 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def _running_loop_call_later() -> Optional[Callable[..., Any]]:
    """``call_later`` of the asyncio event loop running in this thread (the kernel's), else None."""
    try:
        return asyncio.get_running_loop().call_later
    except RuntimeError:
        return None


class Coalescer:
    """Runs ``fn`` for a burst of requests with a trailing edge, resting after each run as long as it took.

    After a run, the next one waits a rest: as long as that run took, at most ``interval_s``. :meth:`request`
    runs ``fn`` at once when the rest since the last run has passed (and always when no event loop runs: then
    every request runs at once, synchronously). Otherwise it schedules one run for the end of the rest; the
    requests that arrive meanwhile add nothing (``fn`` reads the latest values when it runs). So during a drag
    the kernel draws at most half the time while frames take under ``interval_s``, leaving the rest to the
    browser on the same machine; a frame is never more than one rest behind the latest value, and the last
    value is always drawn. (A fixed rest of
    ``interval_s`` after every frame held a 10 ms frame 50 ms behind the hand.)

    Args:
        fn: what to run (``Explorer.update``).
        interval_s: the longest rest between the end of one run and the start of the next.
        clock: seconds, monotonic (a fake one in tests).
        call_later: ``() -> call_later(delay_s, callback)`` or ``None`` when no loop runs; default: the
            running asyncio loop's (in a Jupyter kernel, the kernel's own loop).
    """

    def __init__(self, fn: Callable[[], Any], interval_s: float, clock: Callable[[], float] = time.monotonic,
                 call_later: Callable[[], Optional[Callable[..., Any]]] = _running_loop_call_later) -> None:
        if not (isinstance(interval_s, (int, float)) and interval_s >= 0):
            raise ValueError(f"interval_s must be a number >= 0, got {interval_s!r}")
        self.fn, self.interval_s, self.clock, self._call_later = fn, float(interval_s), clock, call_later
        self._last_end = -math.inf
        self._last_s = 0.0  # how long the last run took
        self._timer = None
        self._requested = -math.inf  # when the pending run was scheduled
        self.queued_s = 0.0  # while a run made on the timer runs: how long it waited; else 0
        self.runs = 0        # runs made (at once or on the timer)
        self.coalesced = 0   # requests that added nothing to a pending run

    def request(self) -> None:
        if self._timer is not None:
            self.coalesced += 1
            return
        wait = self._last_end + min(self.interval_s, self._last_s) - self.clock()
        call_later = self._call_later() if wait > 0 else None
        if call_later is None:
            self._run()
        else:
            self._requested = self.clock()
            self._timer = call_later(wait, self._fire)

    def cancel(self) -> None:
        """Drop a pending run (a run made now makes it redundant)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fire(self) -> None:
        self._timer = None
        self.queued_s = max(0.0, self.clock() - self._requested)
        try:
            self._run()
        finally:
            self.queued_s = 0.0

    def _run(self) -> None:
        start = self.clock()
        try:
            self.fn()
        finally:
            self.runs += 1
            self._last_end = self.clock()
            self._last_s = self._last_end - start


def _png_chunk(tag: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)


def _png(rgba: np.ndarray, level: int = 1) -> bytes:
    """A PNG (8-bit RGB, lossless) of ``(height, width, 3 or 4)`` uint8 pixels; alpha is dropped.

    Every row is stored with PNG filter 0 (none) and the whole deflated at ``level``: Pillow's
    encoder tries the five filters on every row, which took about ten times longer than the
    compression itself on these figures and saved almost nothing on their white space.
    """
    rgba = np.asarray(rgba)
    if rgba.dtype != np.uint8 or rgba.ndim != 3 or rgba.shape[2] not in (3, 4):
        raise ValueError(f"rgba must be a (height, width, 3 or 4) uint8 array, got {rgba.dtype} {rgba.shape}")
    h, w = rgba.shape[:2]
    raw = np.empty((h, 1 + 3 * w), np.uint8)
    raw[:, 0] = 0  # filter type: none
    raw[:, 1:].reshape(h, w, 3)[...] = rgba[..., :3]
    return (b"\x89PNG\r\n\x1a\n"
            + _png_chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))  # 8 bits, RGB, no interlace
            + _png_chunk(b"IDAT", zlib.compress(raw, level))
            + _png_chunk(b"IEND", b""))


class _TextCachingRenderer(RendererAgg):
    """Agg, with the bitmap of each plain-text string kept once rasterised.

    matplotlib 3.11 lays out and rasterises every glyph of every string on every draw, with the
    glyphs at sub-pixel positions; that was most of an explorer's render time. Here a string is
    rasterised whole, once (``FT2Font.set_text`` + ``draw_glyphs_to_bitmap``, then rotated by
    ``draw_text_image``: matplotlib's own ``draw_text`` up to version 3.9), and its bitmap is drawn
    at the nearest whole pixel on later draws. Mathtext and TeX keep matplotlib's own path. If the
    font API differs (another matplotlib), the first failure switches back to it for good.
    """

    MAX_STRINGS = 2048

    def __init__(self, width, height, dpi):
        super().__init__(width, height, dpi)
        self._strings: dict = {}
        self._heights: dict = {}
        self._cache_text = True

    def _get_font_height_metrics(self, prop):
        """(ascent, descent, line gap) in pixels of ``prop``'s font, from its OS/2 or hhea table, once per font.

        matplotlib 3.11's ``Text._get_layout`` asks a renderer for these through this method when it has one
        (the PDF/PS renderers do) and otherwise reads the font's tables again for every string it lays out;
        this is the same computation, cached. ``(None, None, None)`` lets matplotlib compute them itself.
        """
        key = prop.copy()
        hit = self._heights.get(key)
        if hit is None:
            hit = (None, None, None)
            try:
                font = get_font(fontManager._find_fonts_by_props(prop))
                for table_name, gap, ascent, descent in (("OS/2", "sTypoLineGap", "sTypoAscender", "sTypoDescender"),
                                                         ("hhea", "lineGap", "ascent", "descent")):
                    table = font.get_sfnt_table(table_name)
                    if table is None:
                        continue
                    scale = prop.get_size_in_points() * self.dpi / 72 / font.get_sfnt_table("head")["unitsPerEm"]
                    hit = (table[ascent] * scale, -table[descent] * scale, table[gap] * scale)
                    break
            except (AttributeError, KeyError, TypeError, ValueError):
                pass
            self._heights[key] = hit
        return hit

    def _keep(self, key: tuple, font) -> tuple:
        """Rasterise the string ``font`` has just laid out (``set_text``) and keep its bitmap under ``key``."""
        font.draw_glyphs_to_bitmap(antialiased=key[3])
        xo, yo = font.get_bitmap_offset()
        entry = (np.array(font.get_image(), dtype=np.uint8, copy=True), xo / 64.0, yo / 64.0, font.get_descent() / 64.0)
        if len(self._strings) >= self.MAX_STRINGS:
            self._strings.clear()
        self._strings[key] = entry
        return entry

    def get_text_width_height_descent(self, s, prop, ismath):
        """matplotlib's measurement of a string, and its bitmap kept from the same layout.

        matplotlib measures a string before it draws it, and Agg laid a new string out twice, to measure and to
        draw; the layout (``set_text``) was about half of what a new 50-character title cost. Kept under the key
        a default text draws with (``text.antialiased``, no font features, no language), the bitmap lets that
        draw skip the second layout.
        """
        if ismath or not self._cache_text:
            return super().get_text_width_height_descent(s, prop, ismath)
        try:
            font = self._prepare_font(prop)
            font.set_text(s, 0.0, flags=get_hinting_flag())
            w, h = font.get_width_height()  # of the unrotated string, in 1/64 pixels
            d = font.get_descent()
            key = (s, prop.copy(), self.dpi, bool(rcParams["text.antialiased"]), None, None)
            if key not in self._strings:
                self._keep(key, font)
        except (AttributeError, TypeError, ValueError):
            self._cache_text = False
            return super().get_text_width_height_descent(s, prop, ismath)
        return w / 64.0, h / 64.0, d / 64.0

    def draw_text(self, gc, x, y, s, prop, angle, ismath=False, mtext=None):
        if ismath or not self._cache_text:
            return super().draw_text(gc, x, y, s, prop, angle, ismath=ismath, mtext=mtext)
        try:
            features = mtext.get_fontfeatures() if mtext is not None else None
            language = mtext.get_language() if mtext is not None else None
            antialiased = bool(gc.get_antialiased())
            key = (s, prop.copy(), self.dpi, antialiased, tuple(features) if features else None, language)
            entry = self._strings.get(key)
            if entry is None:
                font = self._prepare_font(prop)
                font.set_text(s, 0, flags=get_hinting_flag(), features=features, language=language)
                entry = self._keep(key, font)
        except (AttributeError, TypeError, ValueError):
            self._cache_text = False
            return super().draw_text(gc, x, y, s, prop, angle, ismath=ismath, mtext=mtext)
        image, xo, yo, descent = entry
        # the descent rotates with the text (matplotlib 3.9's draw_text)
        x = round(x + xo + descent * math.sin(math.radians(angle)))
        y = round(y + yo + descent * math.cos(math.radians(angle)))
        self._renderer.draw_text_image(image, x, y + 1, angle, gc)


class _ExplorerCanvas(FigureCanvasAgg):
    """The Agg canvas of an explorer's figure: its renderer is a :class:`_TextCachingRenderer`."""

    def get_renderer(self):
        w, h = self.get_width_height(physical=True)
        key = w, h, self.figure.dpi
        if self._lastKey != key:
            self.renderer = _TextCachingRenderer(w, h, self.figure.dpi)
            self._lastKey = key
        return self.renderer
