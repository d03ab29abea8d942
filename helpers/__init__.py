"""helpers: the reference package of the attention-notebooks series.

Each notebook derives a piece inline, checks it, then hands over to the module here that
computes the same thing; the tests in ``tests/`` pin these modules down. ``helpers.__all__``
exports the pieces of a transformer; the regularizers, the positional-scheme experiments and the
Hugging Face bridges are imported as modules (:mod:`helpers.regularization`,
:mod:`helpers.positional`, :mod:`helpers.hf`). The course's machinery sits beside it in
subpackages, imported from there.

The reference
-------------
* :mod:`helpers.rope` -- rotary position embedding (notebooks 01, 02).
* :mod:`helpers.attention` -- scaled dot-product and multi-head attention (notebook 03).
* :mod:`helpers.model`, :mod:`helpers.tasks`, :mod:`helpers.train` -- the tiny transformer,
  synthetic tasks and training loop (taught in 03, used by 04-06).
* :mod:`helpers.regularization` -- dropout, label smoothing, penalties, calibration (notebook 04).
* :mod:`helpers.heads` -- head importance, pruning, similarity, roles (notebook 05).
* :mod:`helpers.positional` -- shift, length and RoPE-stretching experiments (notebook 06).
* :mod:`helpers.hf` -- bridges to Hugging Face ``transformers`` (notebook 07; imports it lazily).
* :mod:`helpers.kvcache` -- the KV cache and greedy decoding with or without it (notebook 07 §6).
* :mod:`helpers.flash` -- online softmax, tiled (FlashAttention) forward and recomputation
  backward, split-KV decoding (notebook 08).
* :mod:`helpers.utils` -- seeding and determinism; :mod:`helpers.validate` -- the argument
  checks the modules share.

The machinery beside it
-----------------------
* :mod:`helpers.practice` -- the "write it from memory" checkers, their worked solutions and
  planted mistakes, and the daily practice of notebook 00.
* :mod:`helpers.viz` -- figures and slider explorers (no numerics of its own).
* :mod:`helpers.lab` -- measuring instruments: seed sweeps, statistics, round-off printing,
  memory traffic, peak memory, and the opt-in fused RoPE kernel of appendix 02a.
"""
# The machinery, as subpackages (helpers.lab.paired, helpers.practice.check_mha), not in __all__:
from . import lab as lab
from . import practice as practice
from .attention import MultiHeadAttention, causal_mask, scaled_dot_product_attention
from .flash import flash_attention, flash_attention_forward, merge_attention_partials, split_kv_decode
from .heads import (
    PruningCurve,
    ablation_importance,
    attention_at_offset,
    attention_entropy,
    attention_maps,
    head_importance,
    head_outputs,
    head_similarity,
    induction_score,
    label_heads,
    pruning_curve,
    similarity_clusters,
)
from .kvcache import KVCache, greedy_generate, kv_cache_bytes
from .model import POSITIONAL_ENCODINGS, TinyTransformer, TransformerBlock, sinusoidal_encoding
from .positional import use_rope_base
from .rope import (
    RotaryEmbedding,
    apply_rope,
    apply_rope_complex,
    apply_rope_matrix,
    half_to_interleaved,
    interleaved_to_half,
    interleaved_to_half_index,
    llama3_frequencies,
    ntk_scaled_base,
    rope_angles,
    rope_frequencies,
    rotation_matrix,
)
from .tasks import (
    IGNORE_INDEX,
    AssociativeRecallTask,
    CopyTask,
    LookbackTask,
    MixedTask,
    PairRecallTask,
    Split,
    Task,
    TwoPositionTask,
    accuracy,
    make_task,
)
from .train import TrainResult, cross_entropy_loss, evaluate, train
from .utils import seed_everything

__all__ = [
    "seed_everything",
    # rope
    "RotaryEmbedding", "apply_rope", "apply_rope_complex", "apply_rope_matrix", "half_to_interleaved",
    "interleaved_to_half", "interleaved_to_half_index", "llama3_frequencies", "ntk_scaled_base", "rope_angles",
    "rope_frequencies", "rotation_matrix",
    # attention
    "MultiHeadAttention", "causal_mask", "scaled_dot_product_attention",
    # kvcache
    "KVCache", "greedy_generate", "kv_cache_bytes",
    # model, tasks, train
    "POSITIONAL_ENCODINGS", "TinyTransformer", "TransformerBlock", "sinusoidal_encoding",
    "IGNORE_INDEX", "AssociativeRecallTask", "CopyTask", "LookbackTask", "MixedTask", "PairRecallTask", "Split",
    "Task", "TwoPositionTask", "accuracy", "make_task",
    "TrainResult", "cross_entropy_loss", "evaluate", "train",
    # flash (notebook 08)
    "flash_attention", "flash_attention_forward", "merge_attention_partials", "split_kv_decode",
    # heads
    "PruningCurve", "ablation_importance", "attention_at_offset", "attention_entropy",
    "attention_maps", "head_importance", "head_outputs", "head_similarity", "induction_score", "label_heads",
    "pruning_curve", "similarity_clusters",
    # positional
    "use_rope_base",
]
