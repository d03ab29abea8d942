"""helpers.practice: the "write it from memory" exercises of the series and their diagnosing checkers.

Each checker runs the learner's code against the ``helpers`` reference on several inputs and
prints PASS, the classic mistake the learner's results reproduce (with its fix), or the first
input where they differ and by how much. Each topic module ships, for each exercise, a checker,
a worked solution (written as a learner would; it PASSes) and a dict of planted mistakes.

Modules, and the notebook each checker belongs to
-------------------------------------------------
* :mod:`helpers.practice.engine` -- ``diagnose``, the engine every checker runs on
  (``TestInput``, ``PlantedMistake``, ``CheckResult``, ``Reject``), the plumbing of the
  function checkers (``run_check``), and ``mistake_symptoms``, which tabulates what a checker
  reports for each of its planted mistakes.
* :mod:`helpers.practice.rope` -- ``check_rotation_matrix`` (notebook 01);
  ``check_rope_interleaved``, ``check_rope_half`` (notebook 02).
* :mod:`helpers.practice.mha` -- ``check_mha``: the multi-head attention class of notebook 03,
  Exercise 2 (``SCAFFOLD``, the solution ``NotesMHA``, ``PLANTED_BUGS`` and ``BUG_MESSAGES``,
  ``planted_bug_symptoms``).
* :mod:`helpers.practice.attention` -- ``check_causal_sdpa``: causal scaled dot-product
  attention (notebook 03).
* :mod:`helpers.practice.regularization` -- ``check_dropout``, ``check_label_smoothing`` (notebook 04).
* :mod:`helpers.practice.heads` -- ``check_head_importance`` (notebook 05).
* :mod:`helpers.practice.positional` -- ``check_sinusoidal``, ``check_alibi_slopes`` (notebook 06).
* :mod:`helpers.practice.kvcache` -- ``check_kv_decode_step``: a KV-cache decoding step with
  RoPE (notebook 07).
* :mod:`helpers.practice.flash` -- ``check_online_softmax_update``, ``check_merge_partials``:
  the online-softmax update and the merge of two partial attention results (notebook 08).

The daily practice of notebook 00 (每日默写) puts every checker on a spaced-repetition schedule:

* :mod:`helpers.practice.deck` -- ``DECK``, one ``CardSpec`` per checker (prompt, scaffold, hint, section);
  a new checker becomes a card by one entry there.
* :mod:`helpers.practice.runner` -- ``run_solution``: the learner's code and its checks in a child
  process with a time limit.
* :mod:`helpers.practice.store` -- the SQLite store (``ATTN_PRACTICE_STORE`` or the user data folder).
* :mod:`helpers.practice.daily` -- ``Practice`` (due cards, ``deal``, ``submit``, ``hint``, the FSRS
  rating and schedule, the fixed clock ``ATTN_PRACTICE_NOW``); :mod:`helpers.practice.progress`, its
  figure; ``python -m helpers.practice`` (:mod:`helpers.practice.__main__`), the same from a terminal.
  These are not re-exported by :mod:`helpers` (import them from here).

Everything listed in each module's ``__all__`` is re-exported here (``from helpers.practice import
check_mha``); :mod:`helpers` itself exports only the reference code.
"""
from . import attention, engine, flash, heads, kvcache, mha, positional, regularization, rope
from .attention import SDPA_ADVICE, SDPA_MISTAKES, causal_sdpa_solution, check_causal_sdpa
from .daily import Practice
from .deck import CARDS, DECK, CardSpec, PracticeError
from .engine import (
    CheckResult,
    PlantedMistake,
    Reject,
    TestInput,
    as_tensor_result,
    clone_args,
    diagnose,
    mistake_symptoms,
    run_check,
)
from .flash import (
    MERGE_ADVICE,
    MERGE_MISTAKES,
    ONLINE_SOFTMAX_ADVICE,
    ONLINE_SOFTMAX_MISTAKES,
    check_merge_partials,
    check_online_softmax_update,
    merge_partials_solution,
    online_softmax_update_solution,
)
from .heads import HEAD_IMPORTANCE_ADVICE, HEAD_IMPORTANCE_MISTAKES, check_head_importance, head_importance_solution
from .kvcache import KV_DECODE_ADVICE, KV_DECODE_MISTAKES, check_kv_decode_step, kv_decode_step_solution
from .mha import BUG_MESSAGES, PLANTED_BUGS, SCAFFOLD, MHACheck, NotesMHA, check_mha, planted_bug_symptoms
from .positional import (
    ALIBI_SLOPES_ADVICE,
    ALIBI_SLOPES_MISTAKES,
    SINUSOIDAL_ADVICE,
    SINUSOIDAL_MISTAKES,
    alibi_slopes_solution,
    check_alibi_slopes,
    check_sinusoidal,
    sinusoidal_solution,
)
from .regularization import (
    DROPOUT_ADVICE,
    DROPOUT_MISTAKES,
    LABEL_SMOOTHING_ADVICE,
    LABEL_SMOOTHING_MISTAKES,
    LABEL_SMOOTHING_SOLUTIONS,
    check_dropout,
    check_label_smoothing,
    dropout_solution,
)
from .rope import (
    ROPE_ADVICE,
    ROPE_HALF_MISTAKES,
    ROPE_INTERLEAVED_MISTAKES,
    ROTATION_MATRIX_ADVICE,
    ROTATION_MATRIX_MISTAKES,
    check_rope_half,
    check_rope_interleaved,
    check_rotation_matrix,
    rope_half_solution,
    rope_interleaved_solution,
    rotation_matrix_solution,
)

__all__ = [
    *engine.__all__, *rope.__all__, *mha.__all__, *attention.__all__, *regularization.__all__,
    *heads.__all__, *positional.__all__, *kvcache.__all__,
    *flash.__all__,
]
