"""helpers: the small reference package of the attention-notebooks series.

Each notebook derives a piece inline, checks it, then hands over to the module here
that computes the same thing; the tests in ``tests/`` pin these modules down.

Modules
-------
* :mod:`helpers.rope` -- rotary position embedding (notebooks 01, 02).
* :mod:`helpers.attention` -- scaled dot-product and multi-head attention (notebook 03).
* :mod:`helpers.practice` -- the "write it from memory" exercises: ``diagnose``, the engine of
  the diagnosing checkers (planted mistakes, several test inputs; :mod:`helpers.practice.engine`),
  then one module per topic, each with its checkers, worked solutions and planted mistakes:
  :mod:`~helpers.practice.rope` (01, 02), :mod:`~helpers.practice.mha` (``check_mha``, 03),
  :mod:`~helpers.practice.attention` (03), :mod:`~helpers.practice.regularization` (04),
  :mod:`~helpers.practice.heads` (05), :mod:`~helpers.practice.positional` (06),
  :mod:`~helpers.practice.kvcache` (07). Their public names are exported here too.
* :mod:`helpers.model`, :mod:`helpers.tasks`, :mod:`helpers.train` -- the tiny transformer,
  synthetic tasks and training loop (taught in 03, used by 04-06).
* :mod:`helpers.regularization` -- dropout, label smoothing, penalties, calibration (notebook 04).
* :mod:`helpers.heads` -- head importance, pruning, similarity, roles (notebook 05).
* :mod:`helpers.positional` -- shift, length and RoPE-stretching experiments (notebook 06).
* :mod:`helpers.hf` -- bridges to Hugging Face ``transformers`` (notebook 07; imports it lazily).
* :mod:`helpers.kvcache` -- the KV cache and greedy decoding with or without it (notebook 07 §6).
* :mod:`helpers.flash` -- online softmax, tiled (FlashAttention) forward and recomputation backward,
  split-K decoding, the allocation counter ``peak_memory`` (notebook 08); its checkers are in
  :mod:`helpers.practice.flash`.
* :mod:`helpers.viz` -- figures and slider explorers (no numerics of its own).
* :mod:`helpers.utils` -- seeding and determinism.
* :mod:`helpers.roundoff` -- ``roundoff``: how every notebook prints a rounding error (masked by the tests).
* :mod:`helpers.notebook_tools` -- finalize regenerated notebooks (explorers readable without a kernel); not taught.
* :mod:`helpers.sweep` -- run an experiment over seeds and summarise the distribution (notebooks 03-06).
* :mod:`helpers.stats` -- paired comparisons, censored time-to-threshold, "k of n" intervals (``scipy.stats``).
"""
from .utils import seed_everything
from .roundoff import roundoff
from .sweep import SweepError, SweepResult, first_step_reaching, sweep
from .stats import Censored, PairedComparison, k_of_n_interval, paired, proportion_interval, time_to_threshold
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
from .practice.engine import CheckResult, PlantedMistake, Reject, TestInput, diagnose, mistake_symptoms
from .practice.mha import BUG_MESSAGES, PLANTED_BUGS, SCAFFOLD, MHACheck, NotesMHA, check_mha, planted_bug_symptoms
from .practice.rope import (
    ROPE_ADVICE, ROPE_HALF_MISTAKES, ROPE_INTERLEAVED_MISTAKES, ROTATION_MATRIX_ADVICE, ROTATION_MATRIX_MISTAKES,
    check_rope_half, check_rope_interleaved, check_rotation_matrix, rope_half_solution, rope_interleaved_solution,
    rotation_matrix_solution,
)
from .practice.attention import SDPA_ADVICE, SDPA_MISTAKES, causal_sdpa_solution, check_causal_sdpa
from .practice.regularization import (
    DROPOUT_ADVICE, DROPOUT_MISTAKES, LABEL_SMOOTHING_ADVICE, LABEL_SMOOTHING_MISTAKES, LABEL_SMOOTHING_SOLUTIONS,
    check_dropout, check_label_smoothing, dropout_solution,
)
from .practice.heads import HEAD_IMPORTANCE_ADVICE, HEAD_IMPORTANCE_MISTAKES, check_head_importance, head_importance_solution
from .practice.positional import (
    ALIBI_SLOPES_ADVICE, ALIBI_SLOPES_MISTAKES, SINUSOIDAL_ADVICE, SINUSOIDAL_MISTAKES, alibi_slopes_solution,
    check_alibi_slopes, check_sinusoidal, sinusoidal_solution,
)
from .practice.kvcache import KV_DECODE_ADVICE, KV_DECODE_MISTAKES, check_kv_decode_step, kv_decode_step_solution
from .practice.flash import (
    MERGE_ADVICE, MERGE_MISTAKES, ONLINE_SOFTMAX_ADVICE, ONLINE_SOFTMAX_MISTAKES, check_merge_partials,
    check_online_softmax_update, merge_partials_solution, online_softmax_update_solution,
)
from .flash import flash_attention, flash_attention_forward, merge_attention_partials, peak_memory, split_kv_decode
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
    "seed_everything", "roundoff",
    # sweep
    "SweepError", "SweepResult", "first_step_reaching", "sweep",
    # stats
    "Censored", "PairedComparison", "k_of_n_interval", "paired", "proportion_interval", "time_to_threshold",
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
    # practice: the engine and the MHA checker
    "BUG_MESSAGES", "PLANTED_BUGS", "SCAFFOLD", "MHACheck", "NotesMHA", "check_mha",
    "CheckResult", "PlantedMistake", "Reject", "TestInput", "diagnose", "planted_bug_symptoms",
    # practice: the other exercise checkers (notebooks 01, 02, 03, 04, 05, 06, 07)
    "mistake_symptoms",
    "check_rotation_matrix", "rotation_matrix_solution", "ROTATION_MATRIX_MISTAKES", "ROTATION_MATRIX_ADVICE",
    "check_rope_interleaved", "check_rope_half", "rope_interleaved_solution", "rope_half_solution",
    "ROPE_INTERLEAVED_MISTAKES", "ROPE_HALF_MISTAKES", "ROPE_ADVICE",
    "check_causal_sdpa", "causal_sdpa_solution", "SDPA_MISTAKES", "SDPA_ADVICE",
    "check_dropout", "dropout_solution", "DROPOUT_MISTAKES", "DROPOUT_ADVICE",
    "check_label_smoothing", "LABEL_SMOOTHING_SOLUTIONS", "LABEL_SMOOTHING_MISTAKES", "LABEL_SMOOTHING_ADVICE",
    "check_head_importance", "head_importance_solution", "HEAD_IMPORTANCE_MISTAKES", "HEAD_IMPORTANCE_ADVICE",
    "check_sinusoidal", "sinusoidal_solution", "SINUSOIDAL_MISTAKES", "SINUSOIDAL_ADVICE",
    "check_alibi_slopes", "alibi_slopes_solution", "ALIBI_SLOPES_MISTAKES", "ALIBI_SLOPES_ADVICE",
    "check_kv_decode_step", "kv_decode_step_solution", "KV_DECODE_MISTAKES", "KV_DECODE_ADVICE",
    "check_online_softmax_update", "online_softmax_update_solution", "ONLINE_SOFTMAX_MISTAKES", "ONLINE_SOFTMAX_ADVICE",
    "check_merge_partials", "merge_partials_solution", "MERGE_MISTAKES", "MERGE_ADVICE",
    # flash (notebook 08)
    "flash_attention", "flash_attention_forward", "merge_attention_partials", "peak_memory", "split_kv_decode",
    # heads
    "PruningCurve", "TwoPositionTask", "ablation_importance", "attention_at_offset", "attention_entropy",
    "attention_maps", "head_importance", "head_outputs", "head_similarity", "induction_score", "label_heads",
    "pruning_curve", "similarity_clusters",
    # positional
    "PairRecallTask", "use_rope_base",
]
