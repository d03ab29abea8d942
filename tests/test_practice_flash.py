"""The notebook 08 checkers (helpers.practice.flash): each planted mistake is diagnosed as itself,
the worked solutions pass, and the learner's exceptions and wrong interfaces become FAIL messages."""
from __future__ import annotations

import math

import pytest
import torch

from helpers.practice.engine import mistake_symptoms
from helpers.practice.flash import (
    MERGE_ADVICE, MERGE_MISTAKES, ONLINE_SOFTMAX_ADVICE, ONLINE_SOFTMAX_MISTAKES, check_merge_partials,
    check_online_softmax_update, merge_partials_solution, online_softmax_update_solution,
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
