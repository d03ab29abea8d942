r"""Diagnosing checkers for the FlashAttention exercises of notebook 08 ("write it from memory").

Two exercises, each against the :mod:`helpers.flash` reference (itself tested against
``torch.softmax``, ``torch.logsumexp`` and ``F.scaled_dot_product_attention``):

* :func:`check_online_softmax_update`: the learner's ``update(m, l, acc, s, v)``, one block of
  the online softmax with a value accumulator (:func:`helpers.flash.online_softmax_update`):

  .. math::
      m' = \max(m, \max_j s_j),\quad \ell' = e^{m-m'}\ell + \sum_j e^{s_j-m'},\quad
      \mathbf a' = e^{m-m'}\mathbf a + \sum_j e^{s_j-m'}\mathbf v_j

  with the exponents taken relative to 0 where :math:`m' = -\infty` (a block entirely masked).
  The checker folds the learner's update over the blocks of each input, starting from
  :math:`(m, \ell, \mathbf a) = (-\infty, 0, \mathbf 0)`, and compares the final ``m``, ``l``
  and ``acc`` and the attention output ``acc / l`` with the reference's. Inputs: maxima rising
  from block to block (the rescaling matters), falling, a first block entirely masked in every
  row (the NaN trap), a first block masked in some rows only (padding in one batch item: the
  guard must act per row, not per block), one row masked in every block (its result is
  :math:`m = -\infty`, :math:`\ell = 0`, :math:`\mathbf a = 0`: a large negative number in
  place of :math:`-\infty` turns it into the mean of the values), a single block. Planted
  mistakes: :data:`ONLINE_SOFTMAX_MISTAKES`.
* :func:`check_merge_partials`: the learner's ``merge(o1, lse1, o2, lse2)`` of two partial
  attention results over disjoint keys (:func:`helpers.flash.merge_attention_partials`):
  :math:`\lambda = \log(e^{\lambda_1} + e^{\lambda_2})`, :math:`\mathbf o = e^{\lambda_1-\lambda}\mathbf o_1 + e^{\lambda_2-\lambda}\mathbf o_2`.
  Inputs: ordinary log-sum-exps, large ones (about 200: :math:`e^{200}` overflows float32),
  one part empty (:math:`\lambda_2 = -\infty`, :math:`\mathbf o_2 = 0`), both parts empty for
  some queries (result :math:`\mathbf o = 0`, :math:`\lambda = -\infty`). Planted mistakes:
  :data:`MERGE_MISTAKES`.

Worked solutions: :func:`online_softmax_update_solution`, :func:`merge_partials_solution`.
Papers: Milakov & Gimelshein 2018; Dao et al. 2022 (Algorithm 1); the flash-decoding blog (Dao et al. 2023).
"""
from __future__ import annotations

from typing import Callable

import torch

from ..flash import merge_attention_partials, online_softmax_update
from .engine import CheckResult, Reject, TestInput, as_tensor_result, clone_args, run_check

__all__ = [
    "check_online_softmax_update", "online_softmax_update_solution", "ONLINE_SOFTMAX_MISTAKES", "ONLINE_SOFTMAX_ADVICE",
    "check_merge_partials", "merge_partials_solution", "MERGE_MISTAKES", "MERGE_ADVICE",
]

NEG_INF = float("-inf")


# ------------------------------------------------------------------ online softmax update
def online_softmax_update_solution(m, l, acc, s, v):
    """Worked solution: ``m, l`` ``(...)``, ``acc`` ``(..., d)``, scores ``s`` ``(..., B)``, values ``v`` ``(..., B, d)``."""
    m_new = torch.maximum(m, s.amax(dim=-1))
    ref = torch.where(m_new == NEG_INF, torch.zeros_like(m_new), m_new)   # guard: a block entirely -inf
    alpha = torch.exp(m - ref)                                             # rescale the old sums
    p = torch.exp(s - ref.unsqueeze(-1))
    l_new = alpha * l + p.sum(dim=-1)
    acc_new = alpha.unsqueeze(-1) * acc + (p.unsqueeze(-1) * v).sum(dim=-2)
    return m_new, l_new, acc_new


def _guarded(m_new):
    return torch.where(m_new == NEG_INF, torch.zeros_like(m_new), m_new)


def _acc_not_rescaled(m, l, acc, s, v):
    m_new = torch.maximum(m, s.amax(dim=-1))
    ref = _guarded(m_new)
    alpha, p = torch.exp(m - ref), torch.exp(s - ref.unsqueeze(-1))
    return m_new, alpha * l + p.sum(-1), acc + (p.unsqueeze(-1) * v).sum(-2)          # acc keeps the old maximum


def _l_not_rescaled(m, l, acc, s, v):
    m_new = torch.maximum(m, s.amax(dim=-1))
    ref = _guarded(m_new)
    alpha, p = torch.exp(m - ref), torch.exp(s - ref.unsqueeze(-1))
    return m_new, l + p.sum(-1), alpha.unsqueeze(-1) * acc + (p.unsqueeze(-1) * v).sum(-2)


def _rescale_inverted(m, l, acc, s, v):
    m_new = torch.maximum(m, s.amax(dim=-1))
    ref = _guarded(m_new)
    m_old = torch.where(m == NEG_INF, ref, m)          # so that the first block does not blow up
    alpha, p = torch.exp(ref - m_old), torch.exp(s - ref.unsqueeze(-1))               # e^{m' - m}, upside down
    return m_new, alpha * l + p.sum(-1), alpha.unsqueeze(-1) * acc + (p.unsqueeze(-1) * v).sum(-2)


def _rescale_inverted_unguarded(m, l, acc, s, v):
    m_new = torch.maximum(m, s.amax(dim=-1))
    ref = _guarded(m_new)
    alpha, p = torch.exp(ref - m), torch.exp(s - ref.unsqueeze(-1))  # first block: e^{m' - (-inf)} = inf, inf * 0 = NaN
    return m_new, alpha * l + p.sum(-1), alpha.unsqueeze(-1) * acc + (p.unsqueeze(-1) * v).sum(-2)


def _rescale_inverted_no_guard(m, l, acc, s, v):
    m_new = torch.maximum(m, s.amax(dim=-1))
    alpha, p = torch.exp(m_new - m), torch.exp(s - m_new.unsqueeze(-1))
    return m_new, alpha * l + p.sum(-1), alpha.unsqueeze(-1) * acc + (p.unsqueeze(-1) * v).sum(-2)


def _acc_normalised(m, l, acc, s, v):
    m_new, l_new, acc_new = online_softmax_update_solution(m, l, acc, s, v)
    return m_new, l_new, acc_new / l_new.unsqueeze(-1)           # acc / l returned: the next block rescales an average


def _acc_kept_normalised(m, l, acc, s, v):
    m_new = torch.maximum(m, s.amax(dim=-1))                      # FlashAttention's Algorithm 1: the output renormalised
    ref = _guarded(m_new)                                         # at every block, correct but not the unnormalised acc
    alpha, p = torch.exp(m - ref), torch.exp(s - ref.unsqueeze(-1))
    l_new = alpha * l + p.sum(-1)
    safe = torch.where(l_new == 0, torch.ones_like(l_new), l_new)
    return m_new, l_new, ((alpha * l).unsqueeze(-1) * acc + (p.unsqueeze(-1) * v).sum(-2)) / safe.unsqueeze(-1)


def _acc_kept_normalised_unguarded(m, l, acc, s, v):
    m_new = torch.maximum(m, s.amax(dim=-1))
    ref = _guarded(m_new)
    alpha, p = torch.exp(m - ref), torch.exp(s - ref.unsqueeze(-1))
    l_new = alpha * l + p.sum(-1)
    return m_new, l_new, ((alpha * l).unsqueeze(-1) * acc + (p.unsqueeze(-1) * v).sum(-2)) / l_new.unsqueeze(-1)


def _new_max_only(m, l, acc, s, v):
    m_new = torch.maximum(m, s.amax(dim=-1))
    ref = _guarded(m_new)
    alpha = torch.exp(-ref)                            # e^{-m'}: the old sums are taken as if relative to 0
    p = torch.exp(s - ref.unsqueeze(-1))
    return m_new, alpha * l + p.sum(-1), alpha.unsqueeze(-1) * acc + (p.unsqueeze(-1) * v).sum(-2)


def _l_before_max(m, l, acc, s, v):
    l_new = l + torch.exp(s - m.unsqueeze(-1)).sum(-1)                               # summed with the OLD maximum
    m_new = torch.maximum(m, s.amax(dim=-1))
    ref = _guarded(m_new)
    alpha, p = torch.exp(m - ref), torch.exp(s - ref.unsqueeze(-1))
    return m_new, l_new * alpha, alpha.unsqueeze(-1) * acc + (p.unsqueeze(-1) * v).sum(-2)


def _no_guard(m, l, acc, s, v):
    m_new = torch.maximum(m, s.amax(dim=-1))
    alpha, p = torch.exp(m - m_new), torch.exp(s - m_new.unsqueeze(-1))               # -inf - (-inf) = NaN
    return m_new, alpha * l + p.sum(-1), alpha.unsqueeze(-1) * acc + (p.unsqueeze(-1) * v).sum(-2)


def _guard_not_per_row(m, l, acc, s, v):
    if torch.isneginf(s).all():                        # one guard for the whole block, not for each row
        return m, l, acc
    m_new = torch.maximum(m, s.amax(dim=-1))
    alpha, p = torch.exp(m - m_new), torch.exp(s - m_new.unsqueeze(-1))               # NaN in a row masked so far
    return m_new, alpha * l + p.sum(-1), alpha.unsqueeze(-1) * acc + (p.unsqueeze(-1) * v).sum(-2)


def _finite_mask_value(m, l, acc, s, v):
    s = torch.where(torch.isneginf(s), torch.full_like(s, -1e30), s)                 # -1e30 instead of -inf
    m_new = torch.maximum(m, s.amax(dim=-1))           # finite from the first block on: no NaN, no guard needed
    alpha, p = torch.exp(m - m_new), torch.exp(s - m_new.unsqueeze(-1))               # but e^{-1e30 - (-1e30)} = 1
    return m_new, alpha * l + p.sum(-1), alpha.unsqueeze(-1) * acc + (p.unsqueeze(-1) * v).sum(-2)


def _block_max_only(m, l, acc, s, v):
    m_new = s.amax(dim=-1)                             # forgets the maximum so far
    ref = _guarded(m_new)
    alpha, p = torch.exp(m - ref), torch.exp(s - ref.unsqueeze(-1))
    return m_new, alpha * l + p.sum(-1), alpha.unsqueeze(-1) * acc + (p.unsqueeze(-1) * v).sum(-2)


ONLINE_SOFTMAX_MISTAKES: dict[str, Callable] = {
    "accumulator_not_rescaled": _acc_not_rescaled,
    "accumulator_normalised": _acc_normalised,
    "normaliser_not_rescaled": _l_not_rescaled,
    "rescale_inverted": _rescale_inverted,
    "rescaled_by_new_max_only": _new_max_only,
    "normaliser_updated_before_max": _l_before_max,
    "nan_on_masked_block": _no_guard,
    "guard_not_per_row": _guard_not_per_row,
    "finite_mask_value": _finite_mask_value,
    "block_max_only": _block_max_only,
}

# Other ways of writing the same mistakes, tried after ONLINE_SOFTMAX_MISTAKES (same names, same advice).
_ONLINE_SOFTMAX_VARIANTS = (
    ("rescale_inverted", _rescale_inverted_unguarded),
    ("rescale_inverted", _rescale_inverted_no_guard),
    ("accumulator_normalised", _acc_kept_normalised),
    ("accumulator_normalised", _acc_kept_normalised_unguarded),
)

ONLINE_SOFTMAX_ADVICE: dict[str, str] = {
    "accumulator_not_rescaled": (
        "Accumulator not rescaled (accumulator_not_rescaled): when the maximum rises from m to m', the old "
        "acc = sum e^{s_j - m} v_j must be multiplied by e^{m - m'} like l, otherwise its terms and the new "
        "block's are relative to different maxima. acc' = e^{m - m'} acc + sum_j e^{s_j - m'} v_j."
    ),
    "normaliser_not_rescaled": (
        "Normaliser not rescaled (normaliser_not_rescaled): l' = e^{m - m'} l + sum_j e^{s_j - m'}; you added "
        "the new terms to the old l without the factor e^{m - m'}, so the weights no longer sum to 1 once the "
        "maximum rises."
    ),
    "accumulator_normalised": (
        "Accumulator returned normalised (accumulator_normalised): acc must stay the unnormalised "
        "sum_j e^{s_j - m} v_j, the same kind of sum as l; the division acc / l happens once, after the last "
        "block (FlashAttention-2's tweak 1). Return acc' = e^{m - m'} acc + sum_j e^{s_j - m'} v_j, not acc' / l'."
    ),
    "rescale_inverted": (
        "Rescaling factor upside down (rescale_inverted): the old sums are multiplied by e^{m - m'} (<= 1, the "
        "new maximum is larger), not e^{m' - m}. At the first block m = -inf, so e^{m' - m} = inf and inf * 0 = NaN."
    ),
    "rescaled_by_new_max_only": (
        "Old sums rescaled by the new maximum only (rescaled_by_new_max_only): the factor is e^{m - m'}, "
        "the OLD maximum minus the new one; e^{-m'} treats the old sums as if they were relative to 0."
    ),
    "normaliser_updated_before_max": (
        "Normaliser updated before the maximum (normaliser_updated_before_max): the block's terms were summed "
        "relative to the old maximum (e^{s_j - m}, which overflows or is inf when m = -inf) and only then m "
        "updated. Compute m' = max(m, max_j s_j) first, then every exponent relative to m'."
    ),
    "nan_on_masked_block": (
        "NaN on a fully masked block (nan_on_masked_block): while every score seen is -inf, m' = -inf and "
        "s_j - m' = -inf - (-inf) = NaN (notebook 03's fully masked row, one block at a time). Take the "
        "exponents relative to torch.where(m' == -inf, 0, m'): the terms are e^{-inf} = 0 either way."
    ),
    "guard_not_per_row": (
        "Guard per block, not per row (guard_not_per_row): you skip a block only when ALL its scores are -inf, "
        "so a block masked for some rows only (padding in one batch item, not in another) still computes "
        "s_j - m' = -inf - (-inf) = NaN in the masked rows. The guard must act row by row: take the exponents "
        "relative to torch.where(m' == -inf, 0, m'), which leaves the other rows untouched."
    ),
    "finite_mask_value": (
        "A large negative number instead of -inf (finite_mask_value): with -1e30 in place of -inf, a row whose "
        "keys are all masked gets m' = -1e30 and e^{s_j - m'} = e^0 = 1 for every masked key, so its output is "
        "the mean of the values instead of 0 and its log-sum-exp -1e30 + log(B) instead of -inf (notebook 03 "
        "§4's -1e9 mask, one block at a time). Keep -inf and guard m' = -inf: the result is m = -inf, l = 0, acc = 0."
    ),
    "block_max_only": (
        "Maximum of the block only (block_max_only): m' = max(m, max_j s_j) is the maximum of everything "
        "seen so far; the block's own maximum forgets earlier blocks, and the final m + log l is then not "
        "the log-sum-exp."
    ),
}


def _fold_call(f: Callable) -> Callable:
    def run(blocks_s, blocks_v, d):
        shape = blocks_s[0].shape[:-1]
        dtype = blocks_s[0].dtype
        m = torch.full(shape, NEG_INF, dtype=dtype)
        l = torch.zeros(shape, dtype=dtype)
        acc = torch.zeros(shape + (d,), dtype=dtype)
        for s, v in zip(blocks_s, blocks_v):
            out = f(*clone_args([m, l, acc, s, v]))
            if not isinstance(out, (tuple, list)) or len(out) != 3:
                got = f"a {type(out).__name__} of {len(out)}" if isinstance(out, (tuple, list)) else type(out).__name__
                raise Reject("interface", f"your update must return (m, l, acc), got {got}", float("inf"))
            m, l, acc = (as_tensor_result(t, w) for t, w in zip(out, (
                f"m, shape {tuple(shape)}", f"l, shape {tuple(shape)}", f"acc, shape {tuple(shape) + (d,)}")))
            wrong = {n: t.dtype for n, t in (("m", m), ("l", l), ("acc", acc)) if t.dtype != s.dtype}
            if wrong:  # e.g. a .float() somewhere: right up to float32 round-off (~1e-7), but not the inputs' dtype
                raise Reject("dtype", f"your update returned {wrong} for {s.dtype} inputs: a difference of about 1e-7 is "
                             "float32 round-off; keep the inputs' dtype (no .float())", float("inf"))
        safe_l = torch.where(l == 0, torch.ones_like(l), l) if l.shape == shape else l
        o = acc / safe_l.unsqueeze(-1) if (acc.shape == shape + (d,) and safe_l.shape == shape) else acc
        return {"output": o, "m": m, "l": l, "acc": acc}

    return run


def _fold_reference(blocks_s, blocks_v, d):
    shape = blocks_s[0].shape[:-1]
    m = torch.full(shape, NEG_INF, dtype=blocks_s[0].dtype)
    l = torch.zeros_like(m)
    acc = torch.zeros(shape + (d,), dtype=m.dtype)
    for s, v in zip(blocks_s, blocks_v):
        m, l, acc = online_softmax_update(m, l, acc, s, v)
    o = acc / torch.where(l == 0, torch.ones_like(l), l).unsqueeze(-1)
    return {"output": o, "m": m, "l": l, "acc": acc}


def _online_inputs(seed: int) -> list[TestInput]:
    g = torch.Generator().manual_seed(seed)
    d = 4

    def vals(rows, n):
        return torch.randn(rows, n, d, generator=g, dtype=torch.float64)

    rows = 3
    rising = [torch.randn(rows, 5, generator=g, dtype=torch.float64) + 3 * i for i in range(3)]
    falling = [torch.randn(rows, 4, generator=g, dtype=torch.float64) - 3 * i for i in range(3)]
    masked_first = [torch.full((rows, 4), NEG_INF, dtype=torch.float64),
                    torch.randn(rows, 4, generator=g, dtype=torch.float64) * 2,
                    torch.randn(rows, 3, generator=g, dtype=torch.float64) * 2 + 1]
    single = [torch.randn(2, 6, generator=g, dtype=torch.float64) * 2]
    some_rows = [torch.randn(rows, 4, generator=g, dtype=torch.float64) * 2 for _ in range(3)]
    some_rows[0][[0, 2]] = NEG_INF                     # rows 0 and 2: first block padding; row 1: not
    dead_row = [torch.randn(rows, n, generator=g, dtype=torch.float64) * 2 for n in (4, 4, 3)]
    for b in dead_row:
        b[1] = NEG_INF                                 # row 1: every key masked (output 0, log-sum-exp -inf)
    cases = [
        ("3 blocks of 5 scores whose maxima rise (3 rows)", rising),
        ("3 blocks whose maxima fall", falling),
        ("a first block entirely masked (-inf) in every row, then 2 ordinary blocks", masked_first),
        ("a first block masked in rows 0 and 2 only (padding), then 2 ordinary blocks", some_rows),
        ("row 1 masked in every block (no key allowed), rows 0 and 2 ordinary", dead_row),
        ("a single block of 6 scores (2 rows)", single),
    ]
    out = []
    for label, blocks in cases:
        vs = [vals(b.shape[0], b.shape[1]) for b in blocks]
        out.append(TestInput(label, (blocks, vs, d), "update(m, l, acc, s, v)"))
    return out


def check_online_softmax_update(fn: Callable, seed: int = 0) -> CheckResult:
    r"""Check the learner's online-softmax update ``fn(m, l, acc, s, v) -> (m', l', acc')`` (module docstring).

    ``m``, ``l`` ``(rows,)``, ``acc`` ``(rows, d)``, ``s`` ``(rows, B)``, ``v`` ``(rows, B, d)``, float64.
    The update is folded over each input's blocks from :math:`(-\infty, 0, 0)`; compared: the
    output ``acc / l``, then ``m``, ``l`` and ``acc``. Planted mistakes: :data:`ONLINE_SOFTMAX_MISTAKES`.

    Returns:
        :class:`~helpers.practice.engine.CheckResult`; ``print`` it. Never raises on the learner's errors.
    """
    return run_check(
        fn, _fold_call, _fold_reference, ONLINE_SOFTMAX_MISTAKES, ONLINE_SOFTMAX_ADVICE, _online_inputs(seed),
        variants=_ONLINE_SOFTMAX_VARIANTS, atol=1e-9, rtol=1e-7,
        unknown_hint="Check in order: m' = max(m, s.amax(-1)); ref = where(m' == -inf, 0, m'); alpha = exp(m - ref); "
                     "p = exp(s - ref[..., None]); l' = alpha l + p.sum(-1); acc' = alpha[..., None] acc + (p[..., None] v).sum(-2).",
        pass_message="PASS: your update, folded over the blocks, equals helpers.flash.online_softmax_update (output "
                     "acc / l, m, l and acc) with rising and falling maxima, a first block masked in every row, a first block "
                     "masked in some rows only, a row masked in every block, and a single block.",
    )


# --------------------------------------------------------------------------- merge
def merge_partials_solution(o1, lse1, o2, lse2):
    """Worked solution: ``o1, o2`` ``(..., d)``, ``lse1, lse2`` ``(...)``; returns ``(o, lse)``."""
    big = torch.maximum(lse1, lse2)
    big = torch.where(big == NEG_INF, torch.zeros_like(big), big)          # both parts empty: no NaN
    w1, w2 = torch.exp(lse1 - big), torch.exp(lse2 - big)
    total = w1 + w2
    safe = torch.where(total == 0, torch.ones_like(total), total)
    o = (w1.unsqueeze(-1) * o1 + w2.unsqueeze(-1) * o2) / safe.unsqueeze(-1)
    lse = torch.where(total == 0, torch.full_like(total, NEG_INF), big + torch.log(safe))
    return o, lse


def _both_empty_nan(o1, lse1, o2, lse2):
    lse = torch.logaddexp(lse1, lse2)                  # -inf when both parts are empty
    w1, w2 = torch.exp(lse1 - lse), torch.exp(lse2 - lse)                  # -inf - (-inf) = NaN there
    return w1.unsqueeze(-1) * o1 + w2.unsqueeze(-1) * o2, lse


def _averaged(o1, lse1, o2, lse2):
    return (o1 + o2) / 2, torch.logaddexp(lse1, lse2)


def _lse_weights(o1, lse1, o2, lse2):
    w1 = (lse1 / (lse1 + lse2)).unsqueeze(-1)                  # the log-sum-exps themselves as weights
    return w1 * o1 + (1 - w1) * o2, torch.logaddexp(lse1, lse2)


def _lse_added(o1, lse1, o2, lse2):
    o, _ = merge_partials_solution(o1, lse1, o2, lse2)
    return o, lse1 + lse2                                      # log(a) + log(b) = log(ab), not log(a + b)


def _lse_max(o1, lse1, o2, lse2):
    o, _ = merge_partials_solution(o1, lse1, o2, lse2)
    return o, torch.maximum(lse1, lse2)


def _no_max_subtracted(o1, lse1, o2, lse2):
    e1, e2 = torch.exp(lse1), torch.exp(lse2)                  # overflows for lse > 88 in float32
    return (e1.unsqueeze(-1) * o1 + e2.unsqueeze(-1) * o2) / (e1 + e2).unsqueeze(-1), torch.log(e1 + e2)


def _unnormalised_sum(o1, lse1, o2, lse2):
    _, lse = merge_partials_solution(o1, lse1, o2, lse2)
    return o1 + o2, lse                                        # partial outputs are averages: they need weights


def _everything_summed(o1, lse1, o2, lse2):
    return o1 + o2, lse1 + lse2                                # the outputs and the log-sum-exps both summed


def _summed_lse_unguarded(o1, lse1, o2, lse2):
    big = torch.maximum(lse1, lse2)                            # NaN where both parts are empty
    return o1 + o2, big + torch.log(torch.exp(lse1 - big) + torch.exp(lse2 - big))


def _summed_lse_unshifted(o1, lse1, o2, lse2):
    return o1 + o2, torch.log(torch.exp(lse1) + torch.exp(lse2))   # inf above about 88 in float32


MERGE_MISTAKES: dict[str, Callable] = {
    "averaged": _averaged,
    "lse_as_weights": _lse_weights,
    "lse_added": _lse_added,
    "lse_max_only": _lse_max,
    "no_max_subtracted": _no_max_subtracted,
    "outputs_summed": _unnormalised_sum,
    "nan_when_both_empty": _both_empty_nan,
}

# Other ways of writing the same mistakes, tried after MERGE_MISTAKES (same names, same advice).
_MERGE_VARIANTS = (
    ("outputs_summed", _everything_summed),
    ("outputs_summed", _summed_lse_unguarded),
    ("outputs_summed", _summed_lse_unshifted),
)

MERGE_ADVICE: dict[str, str] = {
    "averaged": (
        "Partial outputs averaged (averaged): each part's weight is its share of the total softmax mass, "
        "e^{lse_i - lse}, not 1/2: a part whose keys score higher counts more."
    ),
    "lse_as_weights": (
        "Log-sum-exps used as weights (lse_as_weights): lse_i is a logarithm of the mass; the weights are "
        "e^{lse_i - lse} with lse = log(e^{lse_1} + e^{lse_2})."
    ),
    "lse_added": (
        "Log-sum-exps added (lse_added): lse_1 + lse_2 = log(e^{lse_1} e^{lse_2}), a product. The merged "
        "log-sum-exp is log(e^{lse_1} + e^{lse_2}) = torch.logaddexp(lse_1, lse_2)."
    ),
    "lse_max_only": (
        "Merged log-sum-exp = the larger one (lse_max_only): max(lse_1, lse_2) is only the stabilising shift; "
        "add log(e^{lse_1 - max} + e^{lse_2 - max})."
    ),
    "no_max_subtracted": (
        "Exponentials without subtracting the maximum (no_max_subtracted): e^{lse} overflows float32 above "
        "about 88 (inf / inf = NaN). Subtract max(lse_1, lse_2) before exponentiating (and guard max = -inf)."
    ),
    "outputs_summed": (
        "Partial outputs summed (outputs_summed): o = o1 + o2 counts each part as if it held all the mass, but "
        "each o_i is already normalised over its own keys (an average of values). Weight them by their shares "
        "e^{lse_i - lse}, which sum to 1; the merged lse is logaddexp(lse1, lse2), not lse1 + lse2."
    ),
    "nan_when_both_empty": (
        "NaN when both parts are empty (nan_when_both_empty): lse = logaddexp(lse_1, lse_2) is right, but where "
        "both are -inf (a query with no allowed key in either part) e^{lse_i - lse} = e^{-inf - (-inf)} = NaN. "
        "Subtract a shift that is 0 where max(lse_1, lse_2) = -inf, and divide by w_1 + w_2 only where it is > 0: "
        "the result there is o = 0, lse = -inf."
    ),
}


def _merge_call(f: Callable) -> Callable:
    def run(o1, lse1, o2, lse2):
        out = f(*clone_args([o1, lse1, o2, lse2]))
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            got = f"a {type(out).__name__} of {len(out)}" if isinstance(out, (tuple, list)) else type(out).__name__
            raise Reject("interface", f"your merge must return (o, lse), got {got}", float("inf"))
        o, lse = (as_tensor_result(t, w) for t, w in zip(out, (f"o, shape {tuple(o1.shape)}", f"lse, shape {tuple(lse1.shape)}")))
        return {"output": o, "lse": lse}

    return run


def _merge_reference(o1, lse1, o2, lse2):
    o, lse = merge_attention_partials([o1, o2], [lse1, lse2])
    return {"output": o, "lse": lse}


def _merge_inputs(seed: int) -> list[TestInput]:
    g = torch.Generator().manual_seed(seed)

    def draw(*shape, scale=1.0, shift=0.0):
        return torch.randn(*shape, generator=g) * scale + shift

    cases = [("two parts, (B, H, 1, d) = (2, 3, 1, 8)", (draw(2, 3, 1, 8), draw(2, 3, 1, scale=2, shift=3),
                                                        draw(2, 3, 1, 8), draw(2, 3, 1, scale=2, shift=3)))]
    cases.append(("large log-sum-exps (about 200, float32)", (draw(1, 2, 1, 4), draw(1, 2, 1, shift=200.0),
                                                               draw(1, 2, 1, 4), draw(1, 2, 1, shift=201.0))))
    o1, l1 = draw(2, 2, 1, 4), draw(2, 2, 1, shift=1.0)
    cases.append(("the second part empty (lse -inf, output 0)", (o1, l1, torch.zeros(2, 2, 1, 4), torch.full((2, 2, 1), NEG_INF))))
    cases.append(("parts of unequal mass, 3 queries", (draw(1, 1, 3, 6), draw(1, 1, 3, scale=3),
                                                        draw(1, 1, 3, 6), draw(1, 1, 3, scale=3, shift=-2))))
    o1, l1, o2, l2 = draw(1, 2, 3, 4), draw(1, 2, 3), draw(1, 2, 3, 4), draw(1, 2, 3, shift=1.0)
    for t in (o1, o2):
        t[:, :, 2] = 0.0                               # query 2: both parts empty (no allowed key at all)
    for t in (l1, l2):
        t[:, :, 2] = NEG_INF
    cases.append(("both parts empty for query 2 of 3 (output 0, lse -inf)", (o1, l1, o2, l2)))
    return [TestInput(label, args, "merge(o1, lse1, o2, lse2)") for label, args in cases]


def check_merge_partials(fn: Callable, seed: int = 0) -> CheckResult:
    r"""Check the learner's merge ``fn(o1, lse1, o2, lse2) -> (o, lse)`` of two partial attention results.

    ``o1``, ``o2`` ``(B, H, n, d)``, ``lse1``, ``lse2`` ``(B, H, n)`` (float32). Compared: ``o``, then ``lse``,
    against :func:`helpers.flash.merge_attention_partials`. Planted mistakes: :data:`MERGE_MISTAKES`.

    Returns:
        :class:`~helpers.practice.engine.CheckResult`; ``print`` it. Never raises on the learner's errors.
    """
    return run_check(
        fn, _merge_call, _merge_reference, MERGE_MISTAKES, MERGE_ADVICE, _merge_inputs(seed), variants=_MERGE_VARIANTS,
        unknown_hint="Check: big = max(lse1, lse2) (0 where -inf); w_i = exp(lse_i - big); o = (w1 o1 + w2 o2) / (w1 + w2); "
                     "lse = big + log(w1 + w2).",
        pass_message="PASS: your merge equals helpers.flash.merge_attention_partials (output and log-sum-exp) on 5 inputs: "
                     "ordinary, large log-sum-exps (about 200), an empty part, unequal masses, both parts empty.",
    )
