"""Tests of the "write it from memory" checkers of notebooks 01-07 (helpers.practice.* modules).

For every checker: the worked solution and the library references pass; every planted mistake
(and every variant of one) is diagnosed by its name with its advice; a learner's exception
becomes a FAIL message; a wrong function that matches no planted mistake reports the first
differing input and by how much. The checkers' references are checked against torch itself.
"""
from __future__ import annotations

import functools
import math

import pytest
import torch
import torch.nn.functional as F

from helpers.practice.attention import (
    _SDPA_VARIANTS,
    SDPA_ADVICE,
    SDPA_MISTAKES,
    _sdpa_inputs,
    _sdpa_reference,
    causal_sdpa_solution,
    check_causal_sdpa,
)
from helpers.practice.engine import CheckResult, TestInput, diagnose, mistake_symptoms
from helpers.practice.heads import (
    _HEAD_IMPORTANCE_VARIANTS,
    HEAD_IMPORTANCE_ADVICE,
    HEAD_IMPORTANCE_MISTAKES,
    check_head_importance,
    head_importance_solution,
)
from helpers.practice.kvcache import (
    KV_DECODE_ADVICE,
    KV_DECODE_MISTAKES,
    _kv_reference,
    check_kv_decode_step,
    kv_decode_step_solution,
    kv_step_inputs,
)
from helpers.practice.positional import (
    ALIBI_SLOPES_ADVICE,
    ALIBI_SLOPES_MISTAKES,
    SINUSOIDAL_ADVICE,
    SINUSOIDAL_MISTAKES,
    alibi_slopes_solution,
    check_alibi_slopes,
    check_sinusoidal,
    sinusoidal_solution,
)
from helpers.practice.regularization import (
    _DROPOUT_VARIANTS,
    DROPOUT_ADVICE,
    DROPOUT_MISTAKES,
    LABEL_SMOOTHING_ADVICE,
    LABEL_SMOOTHING_MISTAKES,
    LABEL_SMOOTHING_SOLUTIONS,
    _ls_inputs,
    check_dropout,
    check_label_smoothing,
    dropout_solution,
)
from helpers.practice.rope import (
    _ROPE_VARIANTS,
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
from helpers.regularization import dropout, label_smoothing_cross_entropy
from helpers.rope import apply_rope, rotation_matrix

# (id, check, solution, mistakes, advice, variants, check kwargs)
CHECKERS = [
    ("rotation_matrix", check_rotation_matrix, rotation_matrix_solution, ROTATION_MATRIX_MISTAKES,
     ROTATION_MATRIX_ADVICE, [], {}),
    ("rope_interleaved", check_rope_interleaved, rope_interleaved_solution, ROPE_INTERLEAVED_MISTAKES, ROPE_ADVICE,
     _ROPE_VARIANTS, {}),
    ("rope_half", check_rope_half, rope_half_solution, ROPE_HALF_MISTAKES, ROPE_ADVICE, _ROPE_VARIANTS, {}),
    ("causal_sdpa", check_causal_sdpa, causal_sdpa_solution, SDPA_MISTAKES, SDPA_ADVICE, _SDPA_VARIANTS, {}),
    ("dropout", check_dropout, dropout_solution, DROPOUT_MISTAKES, DROPOUT_ADVICE, _DROPOUT_VARIANTS, {}),
    ("label_smoothing_uniform", check_label_smoothing, LABEL_SMOOTHING_SOLUTIONS["uniform"],
     LABEL_SMOOTHING_MISTAKES["uniform"], LABEL_SMOOTHING_ADVICE, [], {"convention": "uniform"}),
    ("label_smoothing_others", check_label_smoothing, LABEL_SMOOTHING_SOLUTIONS["others"],
     LABEL_SMOOTHING_MISTAKES["others"], LABEL_SMOOTHING_ADVICE, [], {"convention": "others"}),
    ("head_importance", check_head_importance, head_importance_solution, HEAD_IMPORTANCE_MISTAKES,
     HEAD_IMPORTANCE_ADVICE, _HEAD_IMPORTANCE_VARIANTS, {}),
    ("sinusoidal", check_sinusoidal, sinusoidal_solution, SINUSOIDAL_MISTAKES, SINUSOIDAL_ADVICE, [], {}),
    ("alibi_slopes", check_alibi_slopes, alibi_slopes_solution, ALIBI_SLOPES_MISTAKES, ALIBI_SLOPES_ADVICE, [], {}),
    ("kv_decode_step", check_kv_decode_step, kv_decode_step_solution, KV_DECODE_MISTAKES, KV_DECODE_ADVICE, [], {}),
]
IDS = [c[0] for c in CHECKERS]
BY_ID = {c[0]: c for c in CHECKERS}
MISTAKE_CASES = [(c[0], name, f) for c in CHECKERS for name, f in list(c[3].items()) + list(c[5])]


def _case_id(case):
    return f"{case[0]}-{case[1]}"


@pytest.mark.parametrize("cid", IDS)
def test_solution_passes(cid):
    _, check, solution, _, _, _, kw = BY_ID[cid]
    r = check(solution, **kw)
    assert isinstance(r, CheckResult)
    assert r.passed and r.diagnosis is None and str(r).startswith("PASS"), r.message


@pytest.mark.parametrize("case", MISTAKE_CASES, ids=[_case_id(c) for c in MISTAKE_CASES])
def test_each_planted_mistake_is_diagnosed_by_name(case):
    cid, name, mistake = case
    _, check, _, _, advice, _, kw = BY_ID[cid]
    r = check(mistake, **kw)
    assert not r.passed and r.diagnosis == name, r.message
    assert r.message.startswith("FAIL") and advice[name] in r.message
    assert f"({name})" in r.message  # the printed verdict names the mistake
    assert "max |diff| = " in r.symptom and r.failed_input in r.inputs


@pytest.mark.parametrize("cid", IDS)
def test_every_mistake_has_advice_and_differs_from_the_solution(cid):
    _, check, _, mistakes, advice, variants, kw = BY_ID[cid]
    assert set(mistakes) | {n for n, _ in variants} <= set(advice)
    table = mistake_symptoms(check, mistakes, **kw)
    assert list(table) == list(mistakes) and all(s.startswith("FAIL") for s in table.values())


def _raiser(*args, **kwargs):
    raise RuntimeError("my code is broken")


@pytest.mark.parametrize("cid", IDS)
def test_learner_exception_becomes_a_fail_message(cid):
    _, check, _, _, _, _, kw = BY_ID[cid]
    r = check(_raiser, **kw)
    assert not r.passed and r.diagnosis == "exception"
    assert "raised RuntimeError: my code is broken" in r.message and r.message.startswith("FAIL")
    assert r.failed_input == r.inputs[0]


def _perturbed(solution, amount=0.5):
    @functools.wraps(solution)
    def wrong(*args, **kwargs):
        out = solution(*args, **kwargs)
        if isinstance(out, tuple):  # (output, k_cache, v_cache): only the output is off
            return (out[0] * (1 + amount),) + out[1:]
        return torch.as_tensor(out) * (1 + amount)
    return wrong


@pytest.mark.parametrize("cid", IDS)
def test_unknown_mistake_reports_first_differing_input(cid):
    _, check, solution, _, _, _, kw = BY_ID[cid]
    r = check(_perturbed(solution), **kw)
    assert not r.passed and r.diagnosis == "unknown", r.message
    assert "no single common mistake reproduces it" in r.message
    assert r.failed_input == r.inputs[0] and r.symptom.startswith(f"FAIL {r.inputs[0]} (max |diff| = ")
    assert r.max_abs_diff > 0 and math.isfinite(r.max_abs_diff)


@pytest.mark.parametrize("cid", IDS)
def test_wrong_return_type_and_non_callable(cid):
    _, check, _, _, _, _, kw = BY_ID[cid]
    r = check(lambda *a, **k: "oops", **kw)
    assert r.diagnosis == "interface" and "must return" in r.message and "got str" in r.message
    with pytest.raises(TypeError, match=r"fn must be a function \(your implementation\), got int"):
        check(3, **kw)


@pytest.mark.parametrize("cid", ["rope_interleaved", "causal_sdpa", "dropout", "label_smoothing_uniform"])
def test_in_place_learner_does_not_change_what_the_mistakes_see(cid):
    """A learner that edits its input in place works on its own copy: the planted mistakes, run
    afterwards on the same test input, still see the original (else no mistake would match)."""
    _, check, _, mistakes, _, _, kw = BY_ID[cid]
    name, mistake = next(iter(mistakes.items()))

    def in_place(*args, **kwargs):
        out = mistake(*args, **kwargs).clone()
        args[0].mul_(0)  # clobbers its input after computing
        return out

    assert check(in_place, **kw).diagnosis == name


def test_global_rng_untouched():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    for cid in IDS:
        _, check, solution, _, _, _, kw = BY_ID[cid]
        check(solution, **kw)
    assert torch.equal(torch.rand(3), expected)


# ------------------------------------------------------------ per-checker specifics
def test_rotation_matrix_accepts_numpy_and_the_library():
    np = pytest.importorskip("numpy")
    assert check_rotation_matrix(lambda m, d, base=10000: rotation_matrix_solution(m, d, base).numpy()).passed
    assert check_rotation_matrix(lambda m, d, base=10000: rotation_matrix(m, d, base)).passed
    assert isinstance(np.zeros(1), np.ndarray)


def test_rotation_matrix_reference_is_the_notes_matrix():
    """Independent of helpers: R_m @ x equals the notes' element-wise formula (x*cos + x_swapped*(-sin, sin))."""
    d, m = 8, 3
    theta = 10000 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    x = torch.randn(d, dtype=torch.float64)
    cos, sin = torch.cos(m * theta).repeat_interleave(2), torch.sin(m * theta).repeat_interleave(2)
    swapped = torch.stack([x[1::2], x[0::2]], -1).flatten()
    signs = torch.tensor([-1.0, 1.0], dtype=torch.float64).repeat(d // 2)
    torch.testing.assert_close(rotation_matrix_solution(m, d) @ x, x * cos + swapped * signs * sin)


def test_rope_library_passes_and_layouts_are_not_interchangeable():
    assert check_rope_interleaved(apply_rope).passed
    assert check_rope_half(functools.partial(apply_rope, layout="half")).passed
    assert check_rope_interleaved(rope_half_solution).diagnosis == "wrong_layout"
    assert check_rope_half(rope_interleaved_solution).diagnosis == "wrong_layout"


def test_rope_bfloat16_input_is_where_bf16_angles_show():
    r = check_rope_half(ROPE_HALF_MISTAKES["angles_in_input_dtype"])
    assert r.failed_input == "on x (1, 2, 7, 16) bfloat16 at positions 3000..3006"
    assert r.max_abs_diff > 1.0  # radians off, not rounding
    # float32 throughout, cast back to bfloat16 at the end, is within the bfloat16 tolerance: a PASS
    assert check_rope_half(lambda x, positions=None: rope_half_solution(x.float(), positions).to(x.dtype)).passed
    # without the cast back the numbers are right but the dtype is not (attention would then mix dtypes): named
    r = check_rope_half(lambda x, positions=None: rope_half_solution(x.float(), positions))
    assert not r.passed and r.diagnosis == "output_dtype" and "torch.float32 for torch.bfloat16" in r.message


def test_rope_theta_exponent_slip_is_named():
    def rope(x, positions=None):
        seq, d = x.shape[-2], x.shape[-1]
        pos = torch.arange(seq) if positions is None else positions
        angle = pos.float()[:, None] * 10000.0 ** (-torch.arange(d // 2, dtype=torch.float32) / d)
        c, s = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).flatten(-2)

    assert check_rope_interleaved(rope).diagnosis == "theta_exponent_i_over_d"


def test_sdpa_reference_equals_torch():
    for t in _sdpa_inputs(0):
        q, k, v, causal = t.args
        torch.testing.assert_close(_sdpa_reference(q, k, v, causal),
                                   F.scaled_dot_product_attention(q, k, v, is_causal=causal))
    def torch_sdpa(q, k, v, causal=False):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    assert check_causal_sdpa(torch_sdpa).passed


def test_sdpa_accepts_output_weights_tuple():
    from helpers.attention import causal_mask, scaled_dot_product_attention

    def with_weights(q, k, v, causal=False):
        return scaled_dot_product_attention(q, k, v, mask=causal_mask(q.shape[-2]) if causal else None)

    assert check_causal_sdpa(with_weights).passed


def test_dropout_library_passes_and_generator_makes_it_exact():
    assert check_dropout(dropout).passed
    x = torch.randn(4, 7)
    a = dropout_solution(x, 0.3, True, torch.Generator().manual_seed(5))
    b = dropout(x, 0.3, True, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a, b) and bool((a == 0).any())
    # ignoring the generator (global RNG) draws another mask: not a planted mistake, first input reported
    r = check_dropout(lambda x, p, training=True, generator=None: dropout_solution(x, p, training, None))
    assert r.diagnosis == "unknown" and r.failed_input == r.inputs[0]


def test_label_smoothing_reference_equals_torch():
    for t in _ls_inputs(0):
        logits, target, eps, ii = t.args
        torch.testing.assert_close(label_smoothing_cross_entropy(logits, target, eps, "uniform", ignore_index=ii),
                                   F.cross_entropy(logits, target, label_smoothing=eps, ignore_index=ii))

    def torch_ls(logits, target, eps, ignore_index=-100):
        return F.cross_entropy(logits, target, label_smoothing=eps, ignore_index=ignore_index)

    assert check_label_smoothing(torch_ls, "uniform").passed
    assert check_label_smoothing(torch_ls, "others").diagnosis == "wrong_convention"


def test_label_smoothing_others_equals_uniform_with_rescaled_eps():
    from helpers.regularization import uniform_eps_from_others
    for t in _ls_inputs(0):
        logits, target, eps, ii = t.args
        V = logits.shape[1]
        torch.testing.assert_close(
            LABEL_SMOOTHING_SOLUTIONS["others"](logits, target, eps, ii),
            F.cross_entropy(logits, target, label_smoothing=uniform_eps_from_others(eps, V), ignore_index=ii))


def test_dropout_eval_scaled_by_keep_prob_is_named():
    """Inverted dropout in training with the classic evaluation rule (1 - p) x, written as a learner would."""
    def mixed(x, p, training=True, generator=None):
        if not training:
            return x - p * x
        return x * (torch.rand(x.shape, generator=generator) >= p) / (1 - p) if p > 0 else x

    r = check_dropout(mixed)
    assert r.diagnosis == "eval_scaled_by_keep_prob" and "evaluation (training=False)" in r.failed_input
    assert "returns x unchanged" in r.message


def _one_hot_first(convention):
    def loss(logits, target, eps, ignore_index=-100):
        V = logits.shape[-1]
        onehot = F.one_hot(target, V).float()          # before the ignored rows are filtered out
        q = onehot * (1 - eps) + (eps / V if convention == "uniform" else (1 - onehot) * eps / (V - 1))
        keep = target != ignore_index
        return -(q[keep] * logits.log_softmax(-1)[keep]).sum(-1).mean()
    return loss


def _indexed_first(logits, target, eps, ignore_index=-100):
    logp = logits.log_softmax(-1)
    nll = -logp[torch.arange(len(target)), target]     # IndexError at -100
    keep = target != ignore_index
    return ((1 - eps) * nll[keep] - eps * logp[keep].mean(-1)).mean()


def _gathered_first(logits, target, eps, ignore_index=-100):
    logp = logits.log_softmax(-1)
    nll = -logp.gather(1, target[:, None])[:, 0]        # RuntimeError at -100
    keep = target != ignore_index
    return ((1 - eps) * nll[keep] - eps * logp[keep].mean(-1)).mean()


@pytest.mark.parametrize("convention", ["uniform", "others"])
@pytest.mark.parametrize("fn, raised", [(None, "RuntimeError (Class values must be non-negative."),
                                        (_indexed_first, "IndexError (index -100 is out of bounds"),
                                        (_gathered_first, "RuntimeError (index -100 is out of bounds")])
def test_label_smoothing_one_hot_before_filtering_is_named(convention, fn, raised):
    """torch's bare error for an ignored row's target (F.one_hot, an index, gather) becomes a named diagnosis."""
    r = check_label_smoothing(fn or _one_hot_first(convention), convention)
    assert not r.passed and r.diagnosis == "indexed_before_filtering", r.message
    assert r.failed_input == r.inputs[0] and "ignore_index -100" in r.failed_input
    assert f"raised {raised}" in r.message
    assert "Filter rows with target == ignore_index before one_hot" in r.message


def test_label_smoothing_unrelated_error_on_ignored_rows_stays_an_exception():
    def broken(logits, target, eps, ignore_index=-100):
        raise IndexError("list index out of range")
    r = check_label_smoothing(broken, "others")
    assert r.diagnosis == "exception" and "raised IndexError: list index out of range" in r.message


def test_label_smoothing_eps_over_v_in_others_is_named():
    """The notes' convention with torch's per-class share eps/V, written with one_hot after filtering."""
    def slip(logits, target, eps, ignore_index=-100):
        V = logits.shape[-1]
        keep = target != ignore_index
        onehot = F.one_hot(target[keep], V).float()
        q = onehot * (1 - eps) + (1 - onehot) * eps / V
        return -(q * logits[keep].log_softmax(-1)).sum(-1).mean()

    r = check_label_smoothing(slip, "others")
    assert r.diagnosis == "eps_over_V_in_others" and "eps/(V-1) each" in r.message
    assert check_label_smoothing(slip, "uniform").diagnosis != "eps_over_V_in_others"


def test_label_smoothing_convention_error():
    with pytest.raises(ValueError, match=r"convention must be one of \('uniform', 'others'\), got 'notes'"):
        check_label_smoothing(LABEL_SMOOTHING_SOLUTIONS["others"], "notes")


def test_head_importance_library_and_batched_solution_pass():
    from helpers.heads import head_importance

    def batched(model, inputs, targets):  # the per-example gate of shape (batch, L, H): one backward pass
        return head_importance(model, (inputs, targets))

    assert check_head_importance(batched).passed


def _loop_importance(abs_per_example: bool, skip_unscored: bool):
    """A learner's loop over examples, with .backward(): |.| per example or after the sum; the unscored row skipped or not;
    always divided by the batch size."""
    def importance(model, inputs, targets):
        N, H = model.num_layers, model.num_heads
        total = torch.zeros(N, H)
        for x, y in zip(inputs, targets):
            if skip_unscored and (y == -100).all():
                continue
            g = torch.ones(N, H, requires_grad=True)
            F.cross_entropy(model(x[None], head_mask=g)[0], y, ignore_index=-100).backward()
            total += g.grad.abs() if abs_per_example else g.grad
        return (total if abs_per_example else total.abs()) / len(inputs)
    return importance


def test_head_importance_names_two_mistakes_at_once():
    r = check_head_importance(_loop_importance(abs_per_example=False, skip_unscored=False))
    assert r.diagnosis == "averaged_before_abs+mean_over_all_rows", r.message
    assert "Two mistakes at once" in r.message and "no single common mistake" not in r.message


@pytest.mark.parametrize("skip_unscored", [True, False])
def test_head_importance_mean_over_all_rows_whether_or_not_the_row_is_skipped(skip_unscored):
    r = check_head_importance(_loop_importance(abs_per_example=True, skip_unscored=skip_unscored))
    assert r.diagnosis == "mean_over_all_rows", r.message
    assert "you skip the rows" not in r.message and "you divide by the batch size" in r.message
    assert "whether you skip them or not" in r.message


def test_head_importance_per_example_gate_with_summed_loss():
    def batched_sum(model, inputs, targets):  # one backward pass, reduction="sum", mean over every row
        g = torch.ones(inputs.shape[0], model.num_layers, model.num_heads, requires_grad=True)
        F.cross_entropy(model(inputs, head_mask=g).flatten(0, 1), targets.flatten(), ignore_index=-100,
                        reduction="sum").backward()
        return g.grad.abs().mean(0)

    r = check_head_importance(batched_sum)
    assert r.diagnosis == "summed_over_positions+mean_over_all_rows", r.message
    assert "the sum over examples of each example's mean L(x)" in r.message

    def batched_right(model, inputs, targets):  # the same pass with the loss = sum over examples of each mean
        g = torch.ones(inputs.shape[0], model.num_layers, model.num_heads, requires_grad=True)
        ce = F.cross_entropy(model(inputs, head_mask=g).flatten(0, 1), targets.flatten(), ignore_index=-100,
                             reduction="none").view(targets.shape)
        n = (targets != -100).sum(1)
        (ce.sum(1) / n.clamp_min(1)).sum().backward()
        return g.grad.abs()[n > 0].mean(0)

    assert check_head_importance(batched_right).passed
    unknown = check_head_importance(_perturbed(head_importance_solution))
    assert "the loss = the sum over examples of each example's mean L(x)" in unknown.message


def test_per_input_tolerance_of_the_engine():
    def ref(x):
        return x

    def off(x):
        return x + 0.01

    loose = [TestInput("loose", (torch.zeros(3),), atol=0.1)]
    tight = [TestInput("tight", (torch.zeros(3),))]
    assert diagnose(off, ref, [], loose).passed
    r = diagnose(off, ref, [], tight)
    assert not r.passed and r.failed_input == "tight"


def test_positional_libraries_pass():
    from helpers.model import alibi_slopes, sinusoidal_encoding
    assert check_sinusoidal(sinusoidal_encoding).passed
    assert check_alibi_slopes(alibi_slopes).passed
    assert check_alibi_slopes(lambda n: torch.tensor(alibi_slopes_solution(n), dtype=torch.float32)).passed


def test_sinusoidal_solution_is_the_papers_formula():
    """PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(...), written element by element."""
    n, d = 6, 8
    pe = sinusoidal_solution(n, d)
    for p in range(n):
        for i in range(d // 2):
            assert math.isclose(pe[p, 2 * i].item(), math.sin(p / 10000 ** (2 * i / d)), abs_tol=1e-12)
            assert math.isclose(pe[p, 2 * i + 1].item(), math.cos(p / 10000 ** (2 * i / d)), abs_tol=1e-12)


def test_alibi_solution_values_from_the_paper():
    """Press et al.: 8 heads -> 1/2, 1/4, ..., 1/256."""
    assert alibi_slopes_solution(8) == [2.0 ** -k for k in range(1, 9)]


def test_alibi_messages_use_the_lessons_notation():
    """Notebook 06 section 1 writes the slopes s_h = 2^(-8h/H); the checker's messages use the same letters."""
    text = str(check_alibi_slopes(lambda n: [0.3] * n))  # no planted mistake: the fallback hint
    assert "s_h = 2**(-8h/n) for h = 1 .. n" in text and "m_k" not in text
    assert all("m_k" not in advice for advice in ALIBI_SLOPES_ADVICE.values())


def test_kv_reference_is_the_last_row_of_full_causal_attention():
    g = torch.Generator().manual_seed(3)
    for B, H, p, d in [(2, 2, 5, 8), (1, 1, 0, 4), (1, 3, 7, 6), (2, 2, 40, 16)]:
        (qa, ka, va), args = kv_step_inputs(B, H, p, d, g)
        pos = torch.arange(p + 1)
        full = F.scaled_dot_product_attention(apply_rope(qa, pos), apply_rope(ka, pos), va, is_causal=True)
        ref = _kv_reference(*args)
        torch.testing.assert_close(ref["output"], full[..., p:, :])
        torch.testing.assert_close(ref["k_cache"], apply_rope(ka, pos))
        torch.testing.assert_close(ref["v_cache"], va)


def test_kv_solution_decodes_a_sequence_like_full_recomputation():
    """Chaining the worked solution token by token (each step feeding its returned cache to the next)
    gives every row of full causal attention."""
    g = torch.Generator().manual_seed(4)
    B, H, n, d = 2, 2, 9, 8
    q, k, v = (torch.randn(B, H, n, d, generator=g) for _ in range(3))
    pos = torch.arange(n)
    full = F.scaled_dot_product_attention(apply_rope(q, pos), apply_rope(k, pos), v, is_causal=True)
    kc, vc = torch.zeros(B, H, 0, d), torch.zeros(B, H, 0, d)
    for t in range(n):
        out, kc, vc = kv_decode_step_solution(q[..., t:t + 1, :], k[..., t:t + 1, :], v[..., t:t + 1, :], kc, vc)
        torch.testing.assert_close(out, full[..., t:t + 1, :])


def test_kv_wrong_interface():
    r = check_kv_decode_step(lambda q, k, v, kc, vc: q)
    assert r.diagnosis == "interface" and "must return (output, k_cache, v_cache), got Tensor" in r.message
    r = check_kv_decode_step(lambda q, k, v, kc, vc: (q, kc))
    assert r.diagnosis == "interface" and "got a tuple of 2" in r.message


def test_torch_is_causal_aligns_top_left_as_the_kv_advice_says():
    """F.scaled_dot_product_attention(is_causal=True) with Lq=1 < Lk builds tril() of (1, Lk): key 0 only,
    which is the planted top_left_causal_mask mistake (torch 2.13's documented reference: ones(L, S).tril())."""
    g = torch.Generator().manual_seed(5)
    _, (q, k, v, kc, vc) = kv_step_inputs(2, 2, 6, 8, g)
    out, K, V = KV_DECODE_MISTAKES["top_left_causal_mask"](q, k, v, kc, vc)
    q_rot = apply_rope(q, torch.tensor([6]))
    torch.testing.assert_close(F.scaled_dot_product_attention(q_rot, K, V, is_causal=True), out)
    assert not torch.allclose(out, kv_decode_step_solution(q, k, v, kc, vc)[0])


def test_mistake_symptoms_refuses_a_misnamed_mistake():
    with pytest.raises(RuntimeError, match=r"planted mistake 'missing_scale' was diagnosed as 'scale_by_d_k'"):
        mistake_symptoms(check_causal_sdpa, {"missing_scale": SDPA_MISTAKES["scale_by_d_k"]})
