"""Figures and slider explorers of the series: all plotting lives here.

The numerical modules (``helpers.rope`` ...) never plot. Each explorer is a pure
``compute`` function (called directly by tests and notebooks) plus a ``draw`` function
that moves existing artists, wired to sliders by :class:`Explorer`
(:mod:`helpers.viz.explorer`).

One module per notebook:

* :mod:`helpers.viz.rope` -- notebook 01: :func:`rope_explorer`, :func:`long_term_decay`.
"""
from .explorer import FIGSIZE, Explorer
from .rope import long_term_decay, rope_explorer, rope_explorer_state

__all__ = ["FIGSIZE", "Explorer", "long_term_decay", "rope_explorer", "rope_explorer_state"]
