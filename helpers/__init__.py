"""helpers: the small reference package of the attention-notebooks series.

Each notebook derives a piece inline, checks it, then hands over to the module here
that computes the same thing; the tests in ``tests/`` pin these modules down.

Modules
-------
* :mod:`helpers.rope` -- rotary position embedding (notebooks 01, 02).
* :mod:`helpers.viz` -- figures and slider explorers (no numerics of its own).
* :mod:`helpers.utils` -- seeding and determinism.
"""
from .utils import seed_everything
from .rope import (
    RotaryEmbedding,
    apply_rope,
    apply_rope_complex,
    apply_rope_matrix,
    half_to_interleaved,
    interleaved_to_half,
    interleaved_to_half_index,
    rope_angles,
    rope_frequencies,
    rotation_matrix,
)

__all__ = [
    "seed_everything",
    "RotaryEmbedding",
    "apply_rope",
    "apply_rope_complex",
    "apply_rope_matrix",
    "half_to_interleaved",
    "interleaved_to_half",
    "interleaved_to_half_index",
    "rope_angles",
    "rope_frequencies",
    "rotation_matrix",
]
