"""Figures and the explorer of notebook 08 (attention's cost and FlashAttention's tiles).

* :func:`tile_schedule_state` -- the pure function behind the explorer: which tiles of a
  causal score matrix a tiled pass computes (fully, partly masked) or skips, and the bytes of
  the whole score matrix against one tile's working set.
* :func:`tile_schedule_explorer` -- sliders for the sequence length and the two tile sizes.
"""
from __future__ import annotations

import numpy as np
import torch
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure

from .. import flash as _flash
from .explorer import Explorer

__all__ = ["tile_schedule_state", "tile_schedule_explorer"]

SKIPPED, PARTIAL, FULL = 0, 1, 2


def tile_schedule_state(seq_len: int = 1024, block_q: int = 128, block_k: int = 128, causal: bool = True,
                        head_dim: int = 64) -> dict:
    """What notebook 08's explorer shows (pure: no widgets, no figure).

    Args:
        seq_len: sequence length (queries = keys), >= 1.
        block_q, block_k: tile sizes, >= 1.
        causal: whether tiles entirely in the future are skipped.
        head_dim: for the byte counts (float32, batch 1, one head).

    Returns:
        dict with ``grid`` (n_q_blocks, n_k_blocks) int array (0 skipped, 1 computed and partly
        masked, 2 computed, all allowed), ``computed``, ``partial``, ``skipped``, ``total`` tile
        counts, ``fraction_computed``, ``score_bytes`` (the whole float32 score matrix),
        ``tile_bytes`` (:func:`helpers.flash.tiled_working_bytes`), and the inputs.
    """
    for n, name in ((seq_len, "seq_len"), (block_q, "block_q"), (block_k, "block_k"), (head_dim, "head_dim")):
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"{name} must be an int >= 1, got {n!r}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    seq_len, block_q, block_k = int(seq_len), int(block_q), int(block_k)
    nq, nk = -(-seq_len // block_q), -(-seq_len // block_k)
    grid = np.full((nq, nk), FULL, dtype=np.int64)
    if causal:
        for a in range(nq):
            i0, i1 = a * block_q, min((a + 1) * block_q, seq_len)
            for b in range(nk):
                j0, j1 = b * block_k, min((b + 1) * block_k, seq_len)
                if j0 > i1 - 1:
                    grid[a, b] = SKIPPED
                elif j1 - 1 > i0:
                    grid[a, b] = PARTIAL
    computed = int((grid != SKIPPED).sum())
    return {
        "seq_len": seq_len, "block_q": block_q, "block_k": block_k, "causal": causal,
        "grid": grid, "computed": computed, "partial": int((grid == PARTIAL).sum()),
        "skipped": int((grid == SKIPPED).sum()), "total": nq * nk, "fraction_computed": computed / (nq * nk),
        "score_bytes": _flash.score_matrix_bytes(1, 1, seq_len, seq_len, torch.float32),
        "tile_bytes": _flash.tiled_working_bytes(1, 1, min(block_q, seq_len), min(block_k, seq_len), head_dim, torch.float32),
    }


def _summary(s: dict) -> str:
    return (f"L = {s['seq_len']}, tiles {s['block_q']} x {s['block_k']}: {s['computed']} of {s['total']} tiles computed "
            f"({s['fraction_computed']:.3f}), {s['partial']} on the diagonal; score matrix {s['score_bytes']:,} bytes, "
            f"one tile's working set {s['tile_bytes']:,} bytes")


def tile_schedule_explorer(seq_len: int = 1024, block_q: int = 128, block_k: int = 128) -> Explorer:
    """Notebook 08's explorer: the causal tile map for a sequence length and tile sizes (sliders).

    Each square is one tile of the score matrix: grey skipped (entirely in the future), orange
    computed with part of it masked (it crosses the diagonal), blue computed and fully allowed.
    """
    import ipywidgets as widgets

    controls = {
        "seq_len": widgets.IntSlider(value=seq_len, min=64, max=4096, step=64, description="seq_len"),
        "block_q": widgets.IntSlider(value=block_q, min=16, max=512, step=16, description="block_q"),
        "block_k": widgets.IntSlider(value=block_k, min=16, max=512, step=16, description="block_k"),
    }
    fig = Figure(figsize=(6.0, 3.5))
    fig.subplots_adjust(left=0.12, right=0.7, bottom=0.15, top=0.88)
    ax = fig.add_subplot(1, 1, 1)
    cmap = ListedColormap(["0.85", "tab:orange", "tab:blue"])
    im = ax.imshow(np.zeros((2, 2)), cmap=cmap, vmin=-0.5, vmax=2.5, interpolation="nearest", origin="upper",
                   extent=(0, 1, 1, 0))
    cbar = fig.colorbar(im, ax=ax, ticks=[0, 1, 2], fraction=0.08)
    cbar.ax.set_yticklabels(["skipped", "computed,\npart masked", "computed"])
    ax.set_xlabel("key position")
    ax.set_ylabel("query position")
    title = ax.set_title("")

    def draw(s: dict) -> None:
        L = s["seq_len"]
        im.set_data(s["grid"])
        nq, nk = s["grid"].shape
        im.set_extent((0, nk * s["block_k"], nq * s["block_q"], 0))
        ax.set_xlim(0, L)
        ax.set_ylim(L, 0)
        title.set_text(f"causal tiles: {s['computed']} of {s['total']} computed")

    # the axis limits follow seq_len: the two axes move with the tile map (drawn over the rest of the figure,
    # which is rendered once), so a new length needs no full draw
    return Explorer(controls, lambda **v: tile_schedule_state(**v), draw, fig, _summary,
                    animated=[im, ax.xaxis, ax.yaxis, title])
