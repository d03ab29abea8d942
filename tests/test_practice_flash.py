"""The notebook 08 checkers (helpers.practice.flash): each planted mistake is diagnosed as itself,
the worked solutions pass, and the learner's exceptions and wrong interfaces become FAIL messages."""
from __future__ import annotations

import math

import pytest
import torch

from helpers.practice.engine import mistake_symptoms
from helpers.practice.flash import (
    MERGE_ADVICE,
    MERGE_MISTAKES,
    ONLINE_SOFTMAX_ADVICE,
    ONLINE_SOFTMAX_MISTAKES,
    check_merge_partials,
    check_online_softmax_update,
    merge_partials_solution,
    online_softmax_update_solution,
)


def test_solutions_pass():
    for check, sol in [(check_online_softmax_update, online_softmax_update_solution), (check_merge_partials, merge_partials_solution)]:
        r = check(sol)
        assert r.passed and r.diagnosis is None and r.message.startswith("PASS")


@pytest.mark.parametrize("name", list(ONLINE_SOFTMAX_MISTAKES))
def test_each_online_softmax_mistake_is_diagnosed(name):
    r = check_online_softmax_update(ONLINE_SOFTMAX_MISTAKES[name])
    assert not r.passed and r.diagnosis == name
    assert ONLINE_SOFTMAX_ADVICE[name] in r.message


@pytest.mark.parametrize("name", list(MERGE_MISTAKES))
def test_each_merge_mistake_is_diagnosed(name):
    r = check_merge_partials(MERGE_MISTAKES[name])
    assert not r.passed and r.diagnosis == name
    assert MERGE_ADVICE[name] in r.message


def test_mistake_symptoms_table_is_complete():
    assert set(mistake_symptoms(check_online_softmax_update, ONLINE_SOFTMAX_MISTAKES)) == set(ONLINE_SOFTMAX_MISTAKES)
    assert set(mistake_symptoms(check_merge_partials, MERGE_MISTAKES)) == set(MERGE_MISTAKES)
    assert set(ONLINE_SOFTMAX_ADVICE) == set(ONLINE_SOFTMAX_MISTAKES) and set(MERGE_ADVICE) == set(MERGE_MISTAKES)


def test_a_learner_update_written_differently_passes():
    def update(m, l, acc, s, v):       # the same mathematics with other operations
        m2 = torch.max(torch.cat([m.unsqueeze(-1), s], dim=-1), dim=-1).values
        safe = torch.nan_to_num(m2, neginf=0.0)
        a = torch.exp(m - safe)
        w = torch.exp(s - safe[:, None])
        return m2, a * l + w.sum(-1), a[:, None] * acc + torch.einsum("rb,rbd->rd", w, v)

    assert check_online_softmax_update(update).passed


def test_interface_errors_and_exceptions_are_reported_not_raised():
    r = check_online_softmax_update(lambda m, l, acc, s, v: None)
    assert not r.passed and r.diagnosis == "interface" and "(m, l, acc)" in r.message
    r = check_merge_partials(lambda o1, l1, o2, l2: o1)
    assert not r.passed and r.diagnosis == "interface" and "(o, lse)" in r.message

    def boom(m, l, acc, s, v):
        raise RuntimeError("not yet")

    r = check_online_softmax_update(boom)
    assert not r.passed and r.diagnosis == "exception" and "not yet" in r.message


def test_unknown_mistake_gets_the_hint():
    def off(o1, l1, o2, l2):
        o, lse = merge_partials_solution(o1, l1, o2, l2)
        return o * 1.01, lse

    r = check_merge_partials(off)
    assert not r.passed and r.diagnosis == "unknown" and "big = max(lse1, lse2)" in r.message


def test_checkers_reject_a_class():
    with pytest.raises(TypeError, match="fn must be a function"):
        check_merge_partials(dict)


def test_checkers_leave_the_global_rng_alone():
    torch.manual_seed(0)
    before = torch.get_rng_state()
    check_online_softmax_update(online_softmax_update_solution)
    assert torch.equal(before, torch.get_rng_state())


# ------------------------------------------------- the masked cases that a per-block guard or -1e30 gets wrong
def _skip_if_all_masked(m, l, acc, s, v):
    """A learner's per-block guard (Python-level): right on a block masked in every row only."""
    if torch.isneginf(s).all():
        return m, l, acc
    m_new = torch.maximum(m, s.amax(dim=-1))
    alpha, p = torch.exp(m - m_new), torch.exp(s - m_new.unsqueeze(-1))
    return m_new, alpha * l + p.sum(-1), alpha.unsqueeze(-1) * acc + (p.unsqueeze(-1) * v).sum(-2)


def _big_negative(m, l, acc, s, v):
    """A learner's -1e30 mask value written another way (clamp instead of where, on the scores and m)."""
    s, m = s.clamp_min(-1e30), m.clamp_min(-1e30)
    m_new = torch.maximum(m, s.amax(dim=-1))
    alpha, p = torch.exp(m - m_new), torch.exp(s - m_new.unsqueeze(-1))
    return m_new, alpha * l + p.sum(-1), alpha.unsqueeze(-1) * acc + (p.unsqueeze(-1) * v).sum(-2)


@pytest.mark.parametrize("update, name", [(_skip_if_all_masked, "guard_not_per_row"), (_big_negative, "finite_mask_value")])
def test_per_block_guard_and_finite_mask_value_are_caught(update, name):
    r = check_online_softmax_update(update)
    assert not r.passed and r.diagnosis == name and ONLINE_SOFTMAX_ADVICE[name] in r.message
    expected_input = {"guard_not_per_row": "masked in rows 0 and 2 only", "finite_mask_value": "row 1 masked in every block"}
    assert expected_input[name] in r.symptom


def test_the_masked_inputs_are_what_the_docstring_says():
    from helpers.practice.flash import _fold_reference, _online_inputs
    by_label = {t.label: t.args for t in _online_inputs(0)}
    blocks, vs, d = next(a for lab, a in by_label.items() if "rows 0 and 2 only" in lab)
    first = torch.isneginf(blocks[0]).all(dim=-1)
    assert first.tolist() == [True, False, True] and not torch.isneginf(blocks[0]).all()   # some rows only
    blocks, vs, d = next(a for lab, a in by_label.items() if "every block" in lab)
    assert all(torch.isneginf(b[1]).all() and not torch.isneginf(b[[0, 2]]).any() for b in blocks)
    ref = _fold_reference(blocks, vs, d)
    assert ref["m"][1] == -math.inf and ref["l"][1] == 0 and (ref["acc"][1] == 0).all() and (ref["output"][1] == 0).all()
    assert torch.isfinite(ref["m"][[0, 2]]).all()


def test_correct_alternatives_of_the_guard_still_pass():
    def fa1_block_max(m, l, acc, s, v):     # FlashAttention Alg. 1 lines 9-11: the block's own max, then combine
        mt = s.amax(dim=-1)
        pt = torch.exp(s - torch.where(torch.isneginf(mt), torch.zeros_like(mt), mt)[:, None])
        m_new = torch.maximum(m, mt)
        ref = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)
        a_old, a_blk = torch.exp(m - ref), torch.exp(mt - ref)
        return m_new, a_old * l + a_blk * pt.sum(-1), a_old[:, None] * acc + a_blk[:, None] * torch.einsum("rb,rbd->rd", pt, v)

    def nan_to_num_after_exp(m, l, acc, s, v):   # unguarded exponentials, the NaNs (rows masked so far) set to 0
        m_new = torch.maximum(m, s.amax(dim=-1))
        alpha = torch.nan_to_num(torch.exp(m - m_new), nan=0.0)
        p = torch.nan_to_num(torch.exp(s - m_new[:, None]), nan=0.0)
        return m_new, alpha * l + p.sum(-1), alpha[:, None] * acc + (p[..., None] * v).sum(-2)

    for update in (fa1_block_max, nan_to_num_after_exp):
        r = check_online_softmax_update(update)
        assert r.passed, r.message


def test_merge_both_parts_empty_is_checked():
    def logaddexp_merge(o1, lse1, o2, lse2):    # right except where both parts are empty (NaN there)
        lse = torch.logaddexp(lse1, lse2)
        return torch.exp(lse1 - lse)[..., None] * o1 + torch.exp(lse2 - lse)[..., None] * o2, lse

    r = check_merge_partials(logaddexp_merge)
    assert not r.passed and r.diagnosis == "nan_when_both_empty" and "both parts empty" in r.symptom
    assert MERGE_ADVICE["nan_when_both_empty"] in r.message

    def sigmoid_merge(o1, lse1, o2, lse2):      # a correct variant: w1 = sigmoid(lse1 - lse2), guarded
        both = torch.isneginf(lse1) & torch.isneginf(lse2)
        w1 = torch.sigmoid(torch.where(both, torch.zeros_like(lse1), lse1 - lse2))
        o = torch.where(both[..., None], torch.zeros_like(o1), w1[..., None] * o1 + (1 - w1)[..., None] * o2)
        return o, torch.logaddexp(lse1, lse2)

    assert check_merge_partials(sigmoid_merge).passed


def test_online_update_in_float32_is_named_as_round_off():
    from helpers.practice.flash import check_online_softmax_update, online_softmax_update_solution

    def in_float32(m, l, acc, s, v):
        return online_softmax_update_solution(m.float(), l.float(), acc.float(), s.float(), v.float())

    r = check_online_softmax_update(in_float32)
    assert not r.passed and r.diagnosis == "dtype" and "float32 round-off" in r.message


# ------------------------------------------------- learner-written forms of the inverted rescale, the normalised
# accumulator and the plain sum of the merge are named, not answered with the whole recipe
def _inverted_rescale(m, l, acc, s, v):
    """e^{m' - m} instead of e^{m - m'}, with the usual guard: inf * 0 = NaN at the first block."""
    m_new = torch.maximum(m, s.amax(dim=-1))
    ref = torch.where(m_new == -math.inf, torch.zeros_like(m_new), m_new)
    alpha = torch.exp(ref - m)
    p = torch.exp(s - ref[:, None])
    return m_new, alpha * l + p.sum(-1), alpha[:, None] * acc + torch.einsum("rb,rbd->rd", p, v)


def _inverted_rescale_no_guard(m, l, acc, s, v):
    m_new = torch.maximum(m, s.amax(dim=-1))
    alpha, p = torch.exp(m_new - m), torch.exp(s - m_new[:, None])
    return m_new, alpha * l + p.sum(-1), alpha[:, None] * acc + (p[..., None] * v).sum(-2)


def _returns_acc_over_l(m, l, acc, s, v):
    """The solution, but acc / l returned: the next block then rescales an average as if it were a sum."""
    m_new, l_new, acc_new = online_softmax_update_solution(m, l, acc, s, v)
    return m_new, l_new, acc_new / l_new[:, None]


def _keeps_output_normalised(m, l, acc, s, v):
    """FlashAttention Algorithm 1's renormalised output (right output, but acc is not the unnormalised sum)."""
    m_new = torch.maximum(m, s.amax(dim=-1))
    ref = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)
    alpha, p = torch.exp(m - ref), torch.exp(s - ref[:, None])
    l_new = alpha * l + p.sum(-1)
    return m_new, l_new, ((alpha * l)[:, None] * acc + torch.einsum("rb,rbd->rd", p, v)) / l_new[:, None]


@pytest.mark.parametrize("update, name", [
    (_inverted_rescale, "rescale_inverted"), (_inverted_rescale_no_guard, "rescale_inverted"),
    (_returns_acc_over_l, "accumulator_normalised"), (_keeps_output_normalised, "accumulator_normalised"),
])
def test_learner_forms_of_inverted_rescale_and_normalised_accumulator_are_named(update, name):
    r = check_online_softmax_update(update)
    assert not r.passed and r.diagnosis == name, r.message
    assert ONLINE_SOFTMAX_ADVICE[name] in r.message and "no single common mistake" not in r.message


@pytest.mark.parametrize("lse_of", [
    lambda l1, l2: torch.logaddexp(l1, l2),                        # the right lse
    lambda l1, l2: l1 + l2,                                        # summed as well
    lambda l1, l2: torch.log(torch.exp(l1) + torch.exp(l2)),      # unshifted (inf near 200)
    lambda l1, l2: torch.maximum(l1, l2) + torch.log(torch.exp(l1 - torch.maximum(l1, l2)) + torch.exp(l2 - torch.maximum(l1, l2))),
])
def test_plain_sum_of_the_outputs_is_named(lse_of):
    r = check_merge_partials(lambda o1, l1, o2, l2: (o1 + o2, lse_of(l1, l2)))
    assert not r.passed and r.diagnosis == "outputs_summed", r.message
    assert MERGE_ADVICE["outputs_summed"] in r.message and "big = max(lse1, lse2)" not in r.message
