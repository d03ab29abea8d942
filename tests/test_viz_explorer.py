"""Tests of helpers.viz.explorer's redraw pipeline (issue 34): the stage record, the PNG encoder, the
text-caching canvas, blitting with backgrounds per axis limits and overlays, and the coalescing of
slider changes that come from the browser."""
from __future__ import annotations

import io

import numpy as np
import PIL.Image
import pytest
import torch

from helpers.viz.explorer import Coalescer, Explorer, _png, _TextCachingRenderer

STAGES = ("compute", "draw", "render", "encode", "send", "total")


def _tiny(animated: bool = True, overlays: bool = False, coalesce_ms: float = 50.0):
    """An explorer over one slider; ``calls`` records every value compute saw."""
    import ipywidgets as widgets
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4, 3))
    ax = fig.add_subplot()
    (line,) = ax.plot([0, 1], [0, 0], label="a line")
    ax.set(xlim=(0, 1), ylim=(0, 1), title="t", xlabel="x")
    leg = ax.legend(loc="upper left")
    calls = []

    def compute(a):
        calls.append(a)
        return {"a": a}

    ex = Explorer({"a": widgets.IntSlider(value=0, min=0, max=100)}, compute,
                  lambda s: line.set_ydata([s["a"] / 100, s["a"] / 100]),
                  fig, lambda s: f"a = {s['a']}", animated=[line] if animated else None,
                  overlays=[leg] if overlays else None, coalesce_ms=coalesce_ms)
    return ex, calls


def _from_browser(ex, name, value):
    """What a message from the browser does: ipywidgets' set_state, which locks the property while observers run."""
    ex.controls[name].set_state({"value": value})


def _full_render(ex) -> np.ndarray:
    """The figure drawn whole (nothing blitted), as RGB."""
    arts = ex.animated + ex.overlays
    for a in arts:
        a.set_animated(False)
    try:
        ex.figure.canvas.draw()
        return np.asarray(ex.figure.canvas.buffer_rgba())[..., :3].copy()
    finally:
        for a in arts:
            a.set_animated(True)


class FakeLoop:
    """A clock and a ``call_later`` that run nothing until :meth:`advance` passes their time."""

    def __init__(self):
        self.now = 100.0
        self.timers = []

    def clock(self):
        return self.now

    def call_later(self, delay, fn):
        timer = FakeTimer(self.now + delay, fn)
        self.timers.append(timer)
        return timer

    def advance(self, seconds):
        self.now += seconds
        for t in [t for t in self.timers if t.when <= self.now and not t.cancelled]:
            self.timers.remove(t)
            t.fn()


class FakeTimer:
    def __init__(self, when, fn):
        self.when, self.fn, self.cancelled = when, fn, False

    def cancel(self):
        self.cancelled = True


def _with_fake_loop(ex, interval_s=0.05):
    loop = FakeLoop()
    ex._coalescer = Coalescer(ex.update, interval_s, clock=loop.clock, call_later=lambda: loop.call_later)
    return loop


# ------------------------------------------------------------------ stage record
def test_every_update_records_its_stages():
    ex, _ = _tiny()
    ex.set(a=3)
    ex.controls["a"].value = 4
    assert len(ex.stage_ms) == len(ex.times_ms) == 3  # the first frame, set(), a slider assignment
    for rec, total in zip(ex.stage_ms, ex.times_ms):
        assert tuple(rec) == STAGES and all(v >= 0 for v in rec.values())
        assert rec["total"] == total
        assert sum(rec[s] for s in STAGES[:-1]) == pytest.approx(rec["total"], abs=0.5)
    assert ex.last_ms == ex.stage_ms[-1]["total"]
    # the hidden timing widget names the kernel's time and the values the frame was computed from
    assert 'data-values="[4]"' in ex.timing.value and f'data-kernel-ms="{ex.last_ms:.1f}"' in ex.timing.value


# ------------------------------------------------------------------ PNG
def test_png_is_lossless_rgb_of_the_pixels():
    rng = np.random.default_rng(0)
    rgba = rng.integers(0, 256, size=(7, 5, 4), dtype=np.uint8)
    img = PIL.Image.open(io.BytesIO(_png(rgba)))
    assert img.mode == "RGB" and img.size == (5, 7)
    np.testing.assert_array_equal(np.asarray(img), rgba[..., :3])
    np.testing.assert_array_equal(np.asarray(PIL.Image.open(io.BytesIO(_png(rgba[..., :3])))), rgba[..., :3])
    with pytest.raises(ValueError, match=r"rgba must be a \(height, width, 3 or 4\) uint8 array, got float64"):
        _png(np.zeros((2, 2, 3)))


def test_widget_png_is_the_figure_at_its_dpi():
    ex, _ = _tiny(animated=False)
    img = PIL.Image.open(io.BytesIO(ex.image.value))
    assert img.size == (320, 240)  # 4 x 3 in at dpi 80
    np.testing.assert_array_equal(np.asarray(img), np.asarray(ex.figure.canvas.buffer_rgba())[..., :3])


# ------------------------------------------------------------------ text cache
def _labelled(canvas_class):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4, 3), dpi=80)
    fig.add_subplot().set(title="a title", xlabel="x label", ylabel="y label (rotated)")
    canvas = canvas_class(fig)
    canvas.draw()
    return canvas


def test_text_cache_draws_like_matplotlib_and_rasterises_each_string_once():
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from helpers.viz.explorer import _ExplorerCanvas

    stock, cached = _labelled(FigureCanvasAgg), _labelled(_ExplorerCanvas)
    renderer = cached.get_renderer()
    assert isinstance(renderer, _TextCachingRenderer) and renderer._cache_text
    assert {"a title", "x label", "y label (rotated)"} <= {key[0] for key in renderer._strings}
    a = np.asarray(stock.buffer_rgba())[..., :3].astype(int)
    b = np.asarray(cached.buffer_rgba())[..., :3].astype(int)
    # the same picture up to text placed on whole pixels instead of at sub-pixel glyph positions
    assert a.shape == b.shape and (np.abs(a - b).max(-1) > 64).mean() < 0.03
    n = len(renderer._strings)
    cached.draw()
    assert len(renderer._strings) == n  # nothing new to rasterise
    np.testing.assert_array_equal(np.asarray(cached.buffer_rgba())[..., :3], b)


def test_text_cache_falls_back_to_matplotlib_when_the_font_api_differs(monkeypatch):
    import helpers.viz.explorer as explorer_module
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    def broken():
        raise AttributeError("another matplotlib")

    monkeypatch.setattr(explorer_module, "get_hinting_flag", broken)  # only the cached path uses this name
    cached = _labelled(explorer_module._ExplorerCanvas)
    assert cached.get_renderer()._cache_text is False
    np.testing.assert_array_equal(np.asarray(cached.buffer_rgba()), np.asarray(_labelled(FigureCanvasAgg).buffer_rgba()))


# ------------------------------------------------------------------ blitting
def test_blitted_frames_match_a_full_draw_also_when_limits_change():
    from helpers.viz import rope_cache_explorer, tile_schedule_explorer

    for ex, moves in [(tile_schedule_explorer(), [{"seq_len": 2048}, {"block_q": 64}, {"seq_len": 256}]),
                      (rope_cache_explorer(), [{"head_dim": 128}, {"log10_base": 5.0}, {"positions": (64, 4096)}])]:
        assert ex.animated
        for move in moves:
            ex.set(**move)
            blit = np.asarray(PIL.Image.open(io.BytesIO(ex.image.value))).astype(int)
            d = np.abs(blit - _full_render(ex)).max(-1)
            assert (d > 64).mean() < 0.01, (move, (d > 64).mean())  # only where moving artists cross static ones
        assert 1 < len(ex._backgrounds) <= Explorer.BACKGROUNDS  # a background per set of axis limits


def test_backgrounds_are_kept_for_moves_back_and_bounded():
    from helpers.viz import tile_schedule_explorer

    ex = tile_schedule_explorer()
    for L in range(64, 64 * (Explorer.BACKGROUNDS + 4), 64):
        ex.set(seq_len=L)
    assert len(ex._backgrounds) == Explorer.BACKGROUNDS
    keys = list(ex._backgrounds)
    ex.set(seq_len=64 * (Explorer.BACKGROUNDS + 2))  # recently shown: reused, not rendered again
    assert list(ex._backgrounds) == keys[:-2] + keys[-1:] + keys[-2:-1]


def test_overlays_stay_on_top_and_need_animated():
    ex, _ = _tiny(overlays=True)
    leg = ex.overlays[0]
    box = leg.get_window_extent(ex.figure.canvas.get_renderer())
    h = ex.figure.bbox.height
    x0, x1, y0, y1 = int(box.x0) + 3, int(box.x1) - 3, int(h - box.y1) + 3, int(h - box.y0) - 3
    before = np.asarray(PIL.Image.open(io.BytesIO(ex.image.value)))[y0:y1, x0:x1]
    middle = ex.figure.axes[0].transData.inverted().transform(((box.x0 + box.x1) / 2, (box.y0 + box.y1) / 2))[1]
    ex.set(a=int(round(100 * middle)))  # the line runs through the middle of the legend
    after = np.asarray(PIL.Image.open(io.BytesIO(ex.image.value)))
    np.testing.assert_array_equal(after[y0:y1, x0:x1], before)
    assert (np.abs(after.astype(int) - _full_render(ex)).max(-1) > 64).mean() < 0.01
    with pytest.raises(ValueError, match="overlays are pasted over the animated artists: pass animated too"):
        _tiny(animated=False, overlays=True)


def test_static_png_is_the_initial_state_at_full_resolution():
    import base64

    from helpers.viz import rope_explorer

    ex = rope_explorer()
    first = bytes(ex.image.value)
    png = base64.b64decode(ex._repr_mimebundle_()["image/png"])
    assert png == first and PIL.Image.open(io.BytesIO(png)).size == (720, 256)  # 9 x 3.2 in at dpi 80


# ------------------------------------------------------------------ coalescing
def test_coalescer_runs_at_once_then_once_on_the_trailing_edge():
    loop, runs = FakeLoop(), []
    c = Coalescer(lambda: runs.append(loop.now), 0.05, clock=loop.clock, call_later=lambda: loop.call_later)
    c.request()  # idle: at once
    assert runs == [100.0] and not c.pending
    loop.advance(0.01)
    c.request()
    c.request()
    c.request()  # three changes in quick succession: one run, 50 ms after the last ended
    assert runs == [100.0] and c.pending and c.coalesced == 2
    loop.advance(0.03)
    assert runs == [100.0]
    loop.advance(0.01)
    assert runs == [100.0, pytest.approx(100.05)] and not c.pending
    loop.advance(0.2)
    c.request()  # a change after the interval: at once
    assert len(runs) == 3 and runs[-1] == pytest.approx(100.25) and c.runs == 3


def test_coalescer_without_a_loop_runs_every_request_at_once():
    runs = []
    c = Coalescer(lambda: runs.append(1), 10.0, call_later=lambda: None)
    for _ in range(3):
        c.request()
    assert runs == [1, 1, 1] and not c.pending
    with pytest.raises(ValueError, match="interval_s must be a number >= 0, got -1"):
        Coalescer(lambda: None, -1)


def test_browser_changes_coalesce_to_the_last_value():
    ex, calls = _tiny()
    loop = _with_fake_loop(ex)
    loop.advance(1.0)
    _from_browser(ex, "a", 1)  # idle: drawn at once
    assert calls[-1] == 1 and ex.state["a"] == 1
    n = len(calls)
    for v in (2, 3, 4):  # a drag: three values within the interval
        loop.advance(0.005)
        _from_browser(ex, "a", v)
    assert len(calls) == n and ex.state["a"] == 1  # nothing drawn yet
    loop.advance(0.05)
    assert calls[n:] == [4] and ex.state["a"] == 4 and "a = 4" in ex.label.value  # one frame, the last value
    loop.advance(1.0)
    _from_browser(ex, "a", 5)  # after the interval: at once
    assert calls[-1] == 5 and ex.state["a"] == 5


def test_changes_from_code_are_drawn_at_once_and_drop_a_pending_frame():
    ex, calls = _tiny()
    loop = _with_fake_loop(ex)
    _from_browser(ex, "a", 1)  # drawn at once
    _from_browser(ex, "a", 2)  # within the interval: pending
    assert ex._coalescer.pending and ex.state["a"] == 1
    assert ex.set(a=6)["a"] == 6 and ex.state["a"] == 6  # set() returns the new state now
    assert not ex._coalescer.pending  # the pending frame would only repeat it
    ex.controls["a"].value = 7  # a slider assignment in a cell, while a loop runs
    assert ex.state["a"] == 7 and calls[-1] == 7
    n = len(calls)
    loop.advance(1.0)
    assert len(calls) == n


def test_browser_changes_without_a_loop_are_drawn_at_once():
    ex, calls = _tiny()  # pytest runs no event loop: the real Coalescer draws synchronously
    for v in (1, 2, 3):
        _from_browser(ex, "a", v)
    assert calls[-3:] == [1, 2, 3] and ex.state["a"] == 3


def test_explorers_in_a_running_asyncio_loop_coalesce_and_end_at_the_last_value():
    import asyncio

    async def drag():
        ex, calls = _tiny(coalesce_ms=30)
        await asyncio.sleep(0.05)
        for v in range(1, 11):
            _from_browser(ex, "a", v)
        drawn_during = list(calls)
        await asyncio.sleep(0.2)
        return ex, calls, drawn_during

    ex, calls, during = asyncio.run(drag())
    assert during[-1] == 1  # the first change drawn at once, the others left for the timer
    assert calls[-1] == 10 and ex.state["a"] == 10 and len(calls) <= 4
