r"""The practice deck of notebook 00 (每日默写): one card per from-memory exercise of the series.

A :class:`CardSpec` holds what a learner needs to write one piece from memory: the prompt (what to
write, its signature, what it is checked against), a blank scaffold, the hint that may be asked
for, the notebook section it comes from, and the checker(s) that diagnose it (each a
``helpers.practice`` ``check_*`` function, named by ``"module:function"`` so that a child process
can import it). Every checker of the series is on a card; **a new checker becomes a card by one
entry in** :data:`DECK`. ``tests/test_practice_deck.py`` fails when a ``def check_`` in
``helpers/practice`` has no card.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Check", "CardSpec", "DECK", "CARDS", "PRELUDE", "PracticeError", "card"]


class PracticeError(ValueError):
    """A clear error of the practice tools: it names the card (when there is one) and the rule."""


#: What every solution may use without importing it (run before the learner's code in the child).
PRELUDE = (
    "import math\n"
    "import torch\n"
    "import torch.nn.functional as F\n"
    "from torch import nn\n"
    "from helpers import apply_rope\n"
)


@dataclass(frozen=True)
class Check:
    """One checker call: ``checker(<the learner's object named name>, **kwargs)``."""

    name: str  # what the learner's code must define (a function, or a class for check_mha)
    checker: str  # "helpers.practice.<module>:<check_function>"
    kwargs: tuple[tuple[str, Any], ...] = ()
    label: str = ""  # printed before the verdict when a card has several checks


@dataclass(frozen=True)
class CardSpec:
    """One from-memory exercise: prompt, scaffold, hint, source section and checks."""

    id: str
    title: str
    notebook: str  # e.g. "03_mha_from_scratch.ipynb"
    section: str  # e.g. "Exercise 2"
    prompt: str
    scaffold: str
    hint: str
    checks: tuple[Check, ...] = field(default_factory=tuple)

    @property
    def topic(self) -> str:
        """The notebook number, ``"03"``: cards are grouped by it in the progress figure."""
        return self.notebook[:2]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.checks)


def _c(name: str, checker: str, label: str = "", **kwargs: Any) -> Check:
    return Check(name, f"helpers.practice.{checker}", tuple(sorted(kwargs.items())), label)


DECK: tuple[CardSpec, ...] = (
    CardSpec(
        "rotation_matrix", "RoPE's rotation matrix R_m", "01_rope_rotation_matrix.ipynb", "Exercise 6",
        "Write R_m(m, d, base=10000): the d x d block-diagonal matrix of RoPE (float64 is safest). "
        "Block i is the 2 x 2 rotation by m * theta_i on dimensions 2i, 2i+1, with "
        "theta_i = base**(-2i/d). Checked against helpers.rotation_matrix at five settings.",
        'def R_m(m, d, base=10000):\n    """The (d, d) block-diagonal rotation matrix of RoPE at position m, float64."""\n    return ...\n',
        "Start from torch.zeros(d, d, dtype=torch.float64) and fill one 2 x 2 block per pair: "
        "[[cos, -sin], [sin, cos]] of the angle m * theta_i, in radians. The exponent is -2i/d, "
        "so theta_0 = 1 and the last pair turns slowest.",
        (_c("R_m", "rope:check_rotation_matrix"),),
    ),
    CardSpec(
        "rope_interleaved", "Element-wise RoPE, interleaved pairs", "02_rope_efficient.ipynb", "Exercise 5",
        "Write rope_interleaved(x, positions=None): x of shape (..., seq, d), d even, positions (seq,) "
        "defaulting to 0 .. seq-1; the pair (x_2i, x_2i+1) is rotated by m * theta_i, "
        "theta_i = 10000**(-2i/d); return x's dtype. Checked on five inputs, one bfloat16 at positions 3000..3006.",
        'def rope_interleaved(x, positions=None):\n    """x (..., seq, d); pairs (2i, 2i+1) rotated by m * theta_i; angles in float32."""\n    return ...\n',
        "The angles are positions[:, None] * theta[None, :], shape (seq, d/2), in float32 whatever x's "
        "dtype; cast cos and sin to x.dtype only at the end. x[..., 0::2] and x[..., 1::2] are the two "
        "members of each pair: (a cos - b sin, b cos + a sin), back side by side with stack(..., dim=-1).flatten(-2).",
        (_c("rope_interleaved", "rope:check_rope_interleaved"),),
    ),
    CardSpec(
        "rope_half", "Element-wise RoPE, half-split (rotate_half)", "02_rope_efficient.ipynb", "Exercise 5",
        "Write rope_half(x, positions=None): as rope_interleaved, but the pair is (x_i, x_i+d/2), "
        "x * cos + rotate_half(x) * sin (Hugging Face Llama). Checked on five inputs, one bfloat16.",
        'def rope_half(x, positions=None):\n    """x (..., seq, d); pairs (i, i + d/2) rotated by m * theta_i; angles in float32."""\n    return ...\n',
        "Angles in float32, as for the interleaved layout. cat([freqs, freqs], -1) gives each position's "
        "angle in the half layout, and rotate_half(x) = cat([-x[..., d/2:], x[..., :d/2]], -1).",
        (_c("rope_half", "rope:check_rope_half"),),
    ),
    CardSpec(
        "causal_sdpa", "Causal scaled dot-product attention", "03_mha_from_scratch.ipynb", "Exercise 1",
        "Write attention(q, k, v, causal=False) with plain tensor operations: q (B, h, Lq, d_k), "
        "k (B, h, Lk, d_k), v (B, h, Lk, d_v); return softmax(QK^T / sqrt(d_k) + M) V, (B, h, Lq, d_v), "
        "M = -inf for keys j > i when causal. Checked on causal lengths 5, 6, 7 and cross-attention 3 x 7.",
        'def attention(q, k, v, causal=False):\n    """q (B, h, Lq, d_k), k (B, h, Lk, d_k), v (B, h, Lk, d_v) -> (B, h, Lq, d_v)."""\n'
        "    # 1. scores (B, h, Lq, Lk), divided by sqrt(d_k)\n    # 2. if causal: -inf where key j > query i\n"
        "    # 3. softmax over the keys, then the weighted sum of the values\n    return ...\n",
        "q @ k.transpose(-2, -1) has shape (B, h, Lq, Lk); d_k is q.shape[-1]. "
        "torch.ones(L, L, dtype=torch.bool).tril() is True where key j <= query i. masked_fill writes -inf "
        "where its mask is True, so pass the blocked entries. Each query's weights sum to 1 over the keys: which dim?",
        (_c("attention", "attention:check_causal_sdpa"),),
    ),
    CardSpec(
        "mha", "Multi-head attention, the whole module", "03_mha_from_scratch.ipynb", "Exercise 2",
        "Fill in MyMHA: four nn.Linear(d_model, d_model) named linear_q, linear_k, linear_v, linear_out; "
        "forward(query, key, value, mask=None) on (batch, seq, d_model) inputs, mask True where attention "
        "is allowed, returning (output, per-head weights). Checked against helpers.MultiHeadAttention on five "
        "inputs: no mask, causal, a batch of one, cross-attention with a padding mask, a second width.",
        None,  # the scaffold of notebook 03, helpers.practice.mha.SCAFFOLD (filled in below)
        "Split: view(B, L, h, d_k) then transpose(1, 2). Scale by 1/sqrt(d_k). Mask: -inf where mask is False. "
        "softmax(dim=-1). Merge: transpose(1, 2).contiguous().view(B, L, d_model), then linear_out.",
        (_c("MyMHA", "mha:check_mha"),),
    ),
    CardSpec(
        "dropout", "Inverted dropout", "04_regularization.ipynb", "Exercise 4",
        "Write my_dropout(x, p, training=True, generator=None): in training zero each element with "
        "probability p and scale the kept ones so the expectation is unchanged; at evaluation return x. "
        "Draw the mask with torch.rand(x.shape, generator=generator). Checked against helpers.regularization.dropout.",
        'def my_dropout(x, p, training=True, generator=None):\n'
        '    """Inverted dropout of x (any shape) with drop probability p; the identity when not training."""\n'
        '    ...  # your code here\n',
        "Keep an element where its uniform number is at least p (the probability of dropping). "
        "Which branch divides by 1 - p: training or evaluation? What should p = 0 return?",
        (_c("my_dropout", "regularization:check_dropout"),),
    ),
    CardSpec(
        "label_smoothing", "Label-smoothed cross-entropy, both conventions", "04_regularization.ipynb", "Exercise 5",
        "Write my_ls_uniform(logits, target, eps, ignore_index=-100), q = (1-eps) onehot + eps/V, and "
        "my_ls_others(...), q_y = 1-eps and q_k = eps/(V-1) otherwise. logits (N, V), target (N,); rows "
        "with target == ignore_index count for nothing; return the mean over the others, a 0-d tensor.",
        'def my_ls_uniform(logits, target, eps, ignore_index=-100):\n'
        '    """Mean label-smoothed cross-entropy, q = (1 - eps) onehot + eps/V, over rows with target != ignore_index."""\n'
        '    ...  # your code here\n'
        '\n'
        '\n'
        'def my_ls_others(logits, target, eps, ignore_index=-100):\n'
        '    """The same with q_y = 1 - eps and q_k = eps/(V-1) for k != y (the notes\' convention)."""\n'
        '    ...  # your code here\n',
        "Start from torch.log_softmax(logits, dim=-1) and keep the rows with target != ignore_index. "
        "Build q with torch.full_like and index the true classes with q[torch.arange(n), t]. "
        "In one convention you add 1 - eps to the true class, in the other you set it.",
        (_c("my_ls_uniform", "regularization:check_label_smoothing", "uniform", convention="uniform"),
         _c("my_ls_others", "regularization:check_label_smoothing", "others", convention="others")),
    ),
    CardSpec(
        "head_importance", "Head importance (Michel et al.)", "05_head_redundancy.ipynb", "Exercise 5",
        "Write my_importance(model, inputs, targets): model(tokens, head_mask=xi) multiplies head (l, h)'s "
        "output by xi[l, h]; inputs, targets (batch, seq) long, target -100 = not scored. Return "
        "I_h = mean over examples of |dL(x)/d xi_h|, (num_layers, num_heads), L(x) the mean cross-entropy of example x.",
        'def my_importance(model, inputs, targets):\n'
        '    """Michel et al.\'s I = mean over examples x of |dL(x)/d xi|, a (num_layers, num_heads) tensor, i.e. (N, H)."""\n'
        '    ...  # your code here\n',
        "Make the gates a leaf tensor, torch.ones(N, H, requires_grad=True), pass it as head_mask and get "
        "dL/dxi with torch.autograd.grad(loss, gates). Where does the absolute value go: before or after the "
        "average over examples? What should a row whose targets are all -100 contribute?",
        (_c("my_importance", "heads:check_head_importance"),),
    ),
    CardSpec(
        "sinusoidal", "The sinusoidal position table", "06_positional_encodings_compared.ipynb", "Exercise 6",
        "Write my_sinusoidal(n, d_model): the (n, d_model) table of Vaswani et al. sec. 3.5 for positions "
        "0..n-1 (d_model even). Checked against helpers.sinusoidal_encoding at four sizes.",
        'def my_sinusoidal(n, d_model):\n    """The (n, d_model) sinusoidal position table of Vaswani et al. 2017, sec. 3.5."""\n    ...  # your code here\n',
        "One angle per position and pair i = 0..d/2-1: m / 10000**(2i/d). Which function goes in the even "
        "columns, which in the odd ones? Are the two halves side by side or interleaved?",
        (_c("my_sinusoidal", "positional:check_sinusoidal"),),
    ),
    CardSpec(
        "alibi_slopes", "ALiBi's slopes", "06_positional_encodings_compared.ipynb", "Exercise 7",
        "Write my_alibi_slopes(num_heads): the list of the num_heads slopes of Press et al. (2022) for any "
        "head count, as the authors' code computes them. Checked for 8, 2, 6, 12 and 5 heads.",
        'def my_alibi_slopes(num_heads):\n'
        '    """The num_heads ALiBi slopes in the order of Press et al.\'s get_slopes (for 6 heads: 1/4, 1/16, 1/64, 1/256, 1/2, 1/8)."""\n'
        '    ...  # your code here\n',
        "For a power of two n: 2**(-8k/n) for k = 1..n. Otherwise take p, the largest power of two below n: "
        "the p slopes of p heads, then n - p of the slopes of 2p heads, appended (not sorted). Which ones?",
        (_c("my_alibi_slopes", "positional:check_alibi_slopes"),),
    ),
    CardSpec(
        "kv_decode_step", "A KV-cache decoding step with RoPE", "07_from_scratch_to_huggingface.ipynb", "Exercise 5",
        "Write my_decode_step(q, k, v, k_cache, v_cache): q, k, v (B, H, 1, d) of the new token before RoPE; "
        "caches (B, H, p, d), keys already rotated. Return (output (B, H, 1, d), k_cache, v_cache) with the "
        "new token appended. Use apply_rope(x, positions). Checked with 0, 5, 7 and 40 cached tokens.",
        'def my_decode_step(q, k, v, k_cache, v_cache):\n'
        '    """One decoding step: RoPE on the new q, k at their position, append to the caches, attend."""\n'
        '    ...  # your code here\n',
        "The new token's position is the number of tokens already cached. Which of q, k, v get rotated, "
        "and is anything in the cache rotated again? Does the new query need a mask?",
        (_c("my_decode_step", "kvcache:check_kv_decode_step"),),
    ),
    CardSpec(
        "online_softmax_update", "The online-softmax update", "08_attention_cost_flashattention.ipynb", "Exercise 1",
        "Write my_update(m, l, acc, s, v) returning (m_new, l_new, acc_new): m, l (rows,), acc (rows, d), "
        "one block of scores s (rows, B), masked scores -inf, and its values v (rows, B, d). The checker "
        "folds it over several blocks, with masked blocks and rows.",
        "def my_update(m, l, acc, s, v):\n"
        "    # one block of the online softmax with a value accumulator; return (m_new, l_new, acc_new)\n"
        "    ...  # your code here\n",
        "m_new = max(m, s.max(-1)); rescale both l and acc by exp(m - m_new), then add the block's "
        "exp(s - m_new). A row whose scores are all -inf so far has m_new = -inf: guard it per row.",
        (_c("my_update", "flash:check_online_softmax_update"),),
    ),
    CardSpec(
        "merge_partials", "The merge of two partial attention results", "08_attention_cost_flashattention.ipynb", "Exercise 2",
        "Write my_merge(o1, lse1, o2, lse2) returning (o, lse) for two attention results over disjoint keys. "
        "Checked also with log-sum-exps near 200, an empty part, and a query whose two parts are both empty.",
        "def my_merge(o1, lse1, o2, lse2):\n    # merge two attention results over disjoint keys; return (o, lse)\n    ...  # your code here\n",
        "lse = logaddexp(lse1, lse2); each part weighs exp(lse_i - lse). Subtract the maximum before exp, "
        "and decide what a query whose two parts are both empty (-inf) returns.",
        (_c("my_merge", "flash:check_merge_partials"),),
    ),
)


def _with_mha_scaffold(deck: tuple[CardSpec, ...]) -> tuple[CardSpec, ...]:
    from dataclasses import replace

    from .mha import SCAFFOLD

    return tuple(replace(c, scaffold=SCAFFOLD) if c.scaffold is None else c for c in deck)


DECK = _with_mha_scaffold(DECK)
CARDS: dict[str, CardSpec] = {c.id: c for c in DECK}


def card(card_id: str) -> CardSpec:
    """The card named ``card_id``; a :class:`PracticeError` naming the deck's cards otherwise."""
    if isinstance(card_id, CardSpec):
        return card_id
    if card_id in CARDS:
        return CARDS[card_id]
    close = difflib.get_close_matches(str(card_id), CARDS, n=1)
    maybe = f" Did you mean {close[0]!r}?" if close else ""
    raise PracticeError(f"unknown card {card_id!r}: a card is one of {', '.join(CARDS)}.{maybe}")
