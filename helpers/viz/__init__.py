"""Figures and slider explorers of the series: all plotting lives here.

The numerical modules (``helpers.rope`` ...) never plot. Each explorer is a pure
``compute`` function (called directly by tests and notebooks) plus a ``draw`` function
that moves existing artists, wired to sliders by :class:`Explorer`
(:mod:`helpers.viz.explorer`).

One module per notebook:

* :mod:`helpers.viz.rope` -- notebook 01: :func:`rope_explorer`, :func:`long_term_decay`.
* :mod:`helpers.viz.rope_efficient` -- notebook 02: cos/sin cache explorer, precision and benchmark figures.
* :mod:`helpers.viz.attention` -- notebook 03: attention-map grid and the layer/head/query explorer.
* :mod:`helpers.viz.heads` -- notebook 05: pruning and head explorers.
* :mod:`helpers.viz.positional` -- notebook 06: shift/length explorer over precomputed results.
* :mod:`helpers.viz.regularization` -- notebook 04: label-smoothing and dropout explorers.
* :mod:`helpers.viz.sweep` -- notebooks 03-06: seed sweeps (a dot or a thin curve per seed, the mean on top).
* :mod:`helpers.viz.flash` -- notebook 08: the causal tile-schedule explorer.
"""
from .attention import attention_explorer, attention_explorer_state, attention_grid, stack_attention
from .explorer import FIGSIZE, Explorer
from .flash import tile_schedule_explorer, tile_schedule_state
from .heads import head_explorer, head_explorer_state, prune_explorer, prune_explorer_state
from .positional import shift_length_explorer, shift_length_state
from .regularization import dropout_explorer, dropout_state, label_smoothing_explorer, label_smoothing_state
from .rope import long_term_decay, rope_explorer, rope_explorer_state
from .rope_efficient import plot_angle_precision, plot_rope_benchmark, rope_cache_explorer, rope_cache_state
from .sweep import plot_sweep_curves, plot_sweep_points

__all__ = [
    "FIGSIZE", "Explorer",
    "long_term_decay", "rope_explorer", "rope_explorer_state",
    "plot_angle_precision", "plot_rope_benchmark", "rope_cache_explorer", "rope_cache_state",
    "attention_explorer", "attention_explorer_state", "attention_grid", "stack_attention",
    "head_explorer", "head_explorer_state", "prune_explorer", "prune_explorer_state",
    "shift_length_explorer", "shift_length_state",
    "dropout_explorer", "dropout_state", "label_smoothing_explorer", "label_smoothing_state",
    "plot_sweep_curves", "plot_sweep_points",
    "tile_schedule_explorer", "tile_schedule_state",
]
