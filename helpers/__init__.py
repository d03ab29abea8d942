"""helpers: the small reference package of the attention-notebooks series.

Each notebook derives a piece inline, checks it, then hands over to the module here
that computes the same thing; the tests in ``tests/`` pin these modules down.

Modules
-------
* :mod:`helpers.rope` -- rotary position embedding (notebooks 01, 02).
* :mod:`helpers.attention` -- scaled dot-product and multi-head attention (notebook 03).
* :mod:`helpers.check` -- ``diagnose``: the shared engine of the diagnosing checkers
  (planted mistakes, several test inputs); ``check_mha`` on it diagnoses a learner's MHA
  (notebook 03), ``planted_bug_symptoms`` tabulates what it reports for each planted bug.
* :mod:`helpers.model`, :mod:`helpers.tasks`, :mod:`helpers.train` -- the tiny transformer,
  synthetic tasks and training loop (taught in 03, used by 04-06).
* :mod:`helpers.regularization` -- dropout, label smoothing, penalties, calibration (notebook 04).
* :mod:`helpers.heads` -- head importance, pruning, similarity, roles (notebook 05).
* :mod:`helpers.positional` -- shift, length and RoPE-stretching experiments (notebook 06).
* :mod:`helpers.hf` -- bridges to Hugging Face ``transformers`` (notebook 07; imports it lazily).
* :mod:`helpers.kvcache` -- the KV cache and greedy decoding with or without it (notebook 07 §6).
* :mod:`helpers.viz` -- figures and slider explorers (no numerics of its own).
* :mod:`helpers.utils` -- seeding and determinism.
* :mod:`helpers.sweep` -- run an experiment over seeds and summarise the distribution (notebooks 03-06).
"""
from .utils import seed_everything
from .sweep import SweepError, SweepResult, first_step_reaching, sweep
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
from .attention import MultiHeadAttention, causal_mask, scaled_dot_product_attention
from .model import POSITIONAL_ENCODINGS, TinyTransformer, TransformerBlock, sinusoidal_encoding
from .kvcache import KVCache, greedy_generate, kv_cache_bytes
from .tasks import (
    IGNORE_INDEX,
    AssociativeRecallTask,
    CopyTask,
    LookbackTask,
    MixedTask,
    Split,
    Task,
    TwoPositionTask,
    accuracy,
    make_task,
    sequence_accuracy,
)
from .train import TrainResult, cross_entropy_loss, evaluate, train
from .positional import PairRecallTask, use_rope_base
from .check import (
    BUG_MESSAGES, PLANTED_BUGS, SCAFFOLD, CheckResult, MHACheck, NotesMHA, PlantedMistake, Reject, TestInput,
    check_mha, diagnose, planted_bug_symptoms,
)
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

__all__ = [
    "seed_everything",
    # sweep
    "SweepError", "SweepResult", "first_step_reaching", "sweep",
    # rope
    "RotaryEmbedding", "apply_rope", "apply_rope_complex", "apply_rope_matrix", "half_to_interleaved",
    "interleaved_to_half", "interleaved_to_half_index", "llama3_frequencies", "ntk_scaled_base", "rope_angles", "rope_frequencies", "rotation_matrix",
    # attention
    "MultiHeadAttention", "causal_mask", "scaled_dot_product_attention",
    # kvcache
    "KVCache", "greedy_generate", "kv_cache_bytes",
    # model, tasks, train
    "POSITIONAL_ENCODINGS", "TinyTransformer", "TransformerBlock", "sinusoidal_encoding",
    "IGNORE_INDEX", "AssociativeRecallTask", "CopyTask", "LookbackTask", "MixedTask", "Split", "Task",
    "accuracy", "make_task", "sequence_accuracy",
    "TrainResult", "cross_entropy_loss", "evaluate", "train",
    # check
    "BUG_MESSAGES", "PLANTED_BUGS", "SCAFFOLD", "MHACheck", "NotesMHA", "check_mha",
    "CheckResult", "PlantedMistake", "Reject", "TestInput", "diagnose", "planted_bug_symptoms",
    # heads
    "PruningCurve", "TwoPositionTask", "ablation_importance", "attention_at_offset", "attention_entropy",
    "attention_maps", "head_importance", "head_outputs", "head_similarity", "induction_score", "label_heads",
    "pruning_curve", "similarity_clusters",
    # positional
    "PairRecallTask", "use_rope_base",
]
