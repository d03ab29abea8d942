"""Tests of the diagnosing engine (helpers.practice.engine) and the MHA exercise checker built on it
(helpers.practice.mha): passes the solution, names each planted bug, reports exceptions without raising."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from helpers.attention import MultiHeadAttention
from helpers.practice.engine import CheckResult, PlantedMistake, Reject, TestInput, diagnose
from helpers.practice.mha import (
    BUG_MESSAGES,
    PLANTED_BUGS,
    SCAFFOLD,
    MHACheck,
    NotesMHA,
    check_mha,
    planted_bug_symptoms,
)


def test_solution_and_reference_pass():
    for cls in (NotesMHA, MultiHeadAttention):
        r = check_mha(cls)
        assert r.passed and r.diagnosis is None and str(r).startswith("PASS")


def test_solution_equals_reference_module():
    torch.manual_seed(0)
    notes = NotesMHA(16, 4)
    ref = MultiHeadAttention(16, 4)
    ref.load_state_dict(notes.state_dict())
    x = torch.randn(2, 5, 16)
    out, w = notes(x, x, x)
    out_r, w_r = ref(x)
    torch.testing.assert_close(out, out_r)
    torch.testing.assert_close(w, w_r)


@pytest.mark.parametrize("bug", list(PLANTED_BUGS))
def test_each_planted_bug_is_diagnosed(bug):
    r = check_mha(PLANTED_BUGS[bug])
    assert not r.passed
    assert r.diagnosis == bug
    assert BUG_MESSAGES[bug] in r.message and r.message.startswith("FAIL")


@pytest.mark.parametrize("bug", ["missing_scale", "wrong_merge", "mask_inverted", "split_not_transposed", "no_transposes"])
def test_diagnosis_holds_at_other_sizes(bug):
    r = check_mha(PLANTED_BUGS[bug], d_model=24, num_heads=3, seq=4, seed=3)
    assert r.diagnosis == bug


class ForgotTheTranspose(nn.Module):
    """The notes' line x.view(batch_size, -1, self.h, self.d_k).transpose(1,2) with .transpose(1,2) left out."""

    def __init__(self, d_model, num_heads, merge_transposed=True):
        super().__init__()
        self.h, self.d_k, self.merge_transposed = num_heads, d_model // num_heads, merge_transposed
        self.linear_q, self.linear_k = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        self.linear_v, self.linear_out = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)

    def forward(self, query, key, value, mask=None):
        B = query.size(0)
        q, k, v = (f(x).view(B, -1, self.h, self.d_k) for f, x in
                   ((self.linear_q, query), (self.linear_k, key), (self.linear_v, value)))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)
        if mask is not None:
            scores = scores.masked_fill(mask == 0, float("-inf"))
        w = torch.softmax(scores, dim=-1)
        out = w @ v
        out = out.transpose(1, 2) if self.merge_transposed else out
        return self.linear_out(out.contiguous().view(B, -1, self.h * self.d_k)), w


class ForgotBothTransposes(ForgotTheTranspose):
    def __init__(self, d_model, num_heads):
        super().__init__(d_model, num_heads, merge_transposed=False)


@pytest.mark.parametrize("cls, bug", [(ForgotTheTranspose, "split_not_transposed"), (ForgotBothTransposes, "no_transposes")])
def test_the_notes_split_with_the_transpose_forgotten_is_named(cls, bug):
    r = check_mha(cls)
    assert r.diagnosis == bug and "transpose(1, 2)" in r.message, r.message


def test_messages_are_specific():
    assert "sqrt(d_k)" in BUG_MESSAGES["missing_scale"]
    assert "transpose(1, 2)" in BUG_MESSAGES["wrong_merge"] and "transpose(1, 2)" in BUG_MESSAGES["wrong_split"]
    assert "True where attention is ALLOWED" in BUG_MESSAGES["mask_inverted"]
    assert "dim=-1" in BUG_MESSAGES["softmax_over_queries"]
    assert "linear_out" in BUG_MESSAGES["missing_output_projection"]


class NoBias(NotesMHA):
    def __init__(self, d_model, num_heads):
        super().__init__(d_model, num_heads)
        for name in ("linear_q", "linear_k", "linear_v", "linear_out"):
            setattr(self, name, nn.Linear(d_model, d_model, bias=False))


class ReturnsTensorOnly(NotesMHA):
    def forward(self, query, key, value, mask=None):
        return super().forward(query, key, value, mask)[0]


class OffByOne(NotesMHA):
    def project(self, x):
        return self.linear_out(x) + 1.0


class NoOutProj(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        self.linear_q = nn.Linear(d_model, d_model)


class Crashes(NotesMHA):
    def forward(self, query, key, value, mask=None):
        raise RuntimeError("shape mismatch in my code")


class WrongShape(NotesMHA):
    def forward(self, query, key, value, mask=None):
        return super().forward(query, key, value, mask)[0][:, :, :4]


def test_variants_and_interface_problems():
    assert check_mha(NoBias).passed
    r = check_mha(ReturnsTensorOnly)  # the scaffold's contract is (output, weights)
    assert r.diagnosis == "weights_not_returned" and "weights: got None" in r.message
    r = check_mha(OffByOne)
    assert r.diagnosis == "unknown" and "no single common mistake reproduces it" in r.message
    r = check_mha(NoOutProj)
    assert r.diagnosis == "interface" and "needs an attribute linear_k = nn.Linear(d_model, d_model)" in r.message
    r = check_mha(Crashes)
    assert r.diagnosis == "interface" and "raised RuntimeError: shape mismatch in my code" in r.message
    r = check_mha(WrongShape)
    assert r.diagnosis == "shape" and "output shape (2, 6, 4), expected (batch, seq_q, d_model) = (2, 6, 16)" in r.message


def test_scaffold_is_valid_python():
    compile(SCAFFOLD, "<scaffold>", "exec")
    assert "class MyMHA(nn.Module)" in SCAFFOLD and "linear_out" in SCAFFOLD


def test_check_mha_errors():
    with pytest.raises(TypeError, match=r"cls must be a class \(not an instance\), got NotesMHA"):
        check_mha(NotesMHA(16, 4))
    with pytest.raises(ValueError, match=r"need num_heads >= 2.* got d_model=16, num_heads=1, seq=6"):
        check_mha(NotesMHA, num_heads=1)


# ------------------------------------------------ the MHA checker: new cases and planted bugs
class LearnerMHA(nn.Module):
    """A learner's own solution, written independently of NotesMHA; options plant one mistake each."""

    kv_len_from_query = False
    return_weights = "per_head"  # or "none", "averaged", "tensor_only"

    def __init__(self, d_model, num_heads):
        super().__init__()
        self.h, self.d_k = num_heads, d_model // num_heads
        self.linear_q = nn.Linear(d_model, d_model)
        self.linear_k = nn.Linear(d_model, d_model)
        self.linear_v = nn.Linear(d_model, d_model)
        self.linear_out = nn.Linear(d_model, d_model)

    def forward(self, query, key, value, mask=None):
        B, Lq, _ = query.shape
        Lk = Lq if self.kv_len_from_query else key.size(1)
        q = self.linear_q(query).reshape(B, Lq, self.h, self.d_k).permute(0, 2, 1, 3)
        k = self.linear_k(key).reshape(B, Lk, self.h, self.d_k).permute(0, 2, 1, 3)
        v = self.linear_v(value).reshape(B, Lk, self.h, self.d_k).permute(0, 2, 1, 3)
        scores = torch.einsum("bhqd,bhkd->bhqk", q, k) * self.d_k ** -0.5
        if mask is not None:
            scores = scores.masked_fill(mask.logical_not(), float("-inf"))
        weights = scores.softmax(-1)
        out = self.linear_out(torch.einsum("bhqk,bhkd->bqhd", weights, v).reshape(B, Lq, -1))
        if self.return_weights == "none":
            return out, None
        if self.return_weights == "averaged":
            return out, weights.mean(1)
        if self.return_weights == "tensor_only":
            return out
        return out, weights


def _variant(**attrs):
    return type("MyMHA", (LearnerMHA,), attrs)


def test_independent_learner_solution_passes():
    r = check_mha(LearnerMHA)
    assert r.passed and r.message.startswith("PASS: LearnerMHA matches helpers.MultiHeadAttention")
    assert len(r.inputs) == 5 and any("cross-attention" in label for label in r.inputs)


def test_kv_reshaped_with_the_query_length_is_caught_on_cross_attention():
    """Passes the two self-attention inputs of the old checker (Lq == Lk), then crashes on cross-attention."""
    r = check_mha(_variant(kv_len_from_query=True))
    assert not r.passed and r.diagnosis == "kv_split_with_query_length"
    assert r.failed_input == "in cross-attention (Lq=3, Lk=7) with a (B, 1, 1, Lk) padding mask"
    assert r.message.startswith("FAIL in cross-attention (Lq=3, Lk=7) with a (B, 1, 1, Lk) padding mask: "
                                "forward(query, key, value, mask=mask) raised RuntimeError: ")
    assert BUG_MESSAGES["kv_split_with_query_length"] in r.message


@pytest.mark.parametrize("mode, diagnosis, text", [
    ("none", "weights_not_returned", "FAIL without a mask (weights: got None, expected a tensor of shape (2, 4, 6, 6))"),
    ("tensor_only", "weights_not_returned", "FAIL without a mask (weights: got None, expected a tensor of shape (2, 4, 6, 6))"),
    ("averaged", "shape", "FAIL without a mask (weights: shape (2, 6, 6), expected (2, 4, 6, 6))"),
])
def test_the_returned_weights_are_checked(mode, diagnosis, text):
    r = check_mha(_variant(return_weights=mode))
    assert not r.passed and r.diagnosis == diagnosis and r.symptom == text and r.message.startswith(text)


def test_reference_equals_torch_multihead_attention_on_every_input():
    """The checker's reference (helpers.MultiHeadAttention) against nn.MultiheadAttention on the checker's own
    inputs: outputs, per-head weights (average_attn_weights=False) and their mean (the default, averaged)."""
    from helpers.practice.mha import _mha_inputs, _mha_reference

    for t in _mha_inputs(16, 4, 2, 6, 0, bias=True):
        (x,) = t.args
        ref = _mha_reference(x)
        torch_mha = nn.MultiheadAttention(x.d_model, x.num_heads, batch_first=True).eval()
        with torch.no_grad():
            torch_mha.in_proj_weight.copy_(torch.cat([x.weights[n][0] for n in ("linear_q", "linear_k", "linear_v")]))
            torch_mha.in_proj_bias.copy_(torch.cat([x.weights[n][1] for n in ("linear_q", "linear_k", "linear_v")]))
            torch_mha.out_proj.weight.copy_(x.weights["linear_out"][0])
            torch_mha.out_proj.bias.copy_(x.weights["linear_out"][1])
            kw = {}
            if x.mask is not None and x.mask.dim() == 4:  # (B, 1, 1, Lk) padding, True = allowed
                kw["key_padding_mask"] = ~x.mask[:, 0, 0]
            elif x.mask is not None:
                kw["attn_mask"] = ~x.mask
            out, w = torch_mha(x.query, x.key, x.value, average_attn_weights=False, **kw)
            _, w_avg = torch_mha(x.query, x.key, x.value, **kw)
        torch.testing.assert_close(ref["output"], out, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(ref["weights"], w, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(ref["weights"].mean(1), w_avg, atol=1e-6, rtol=1e-5)


def test_inputs_cover_the_shapes_promised():
    from helpers.practice.mha import _mha_inputs

    shapes = [(x.query.shape, x.key.shape, None if x.mask is None else tuple(x.mask.shape))
              for (x,) in (t.args for t in _mha_inputs(16, 4, 2, 6, 0, bias=True))]
    assert shapes[0] == ((2, 6, 16), (2, 6, 16), None) and shapes[1][2] == (6, 6)
    assert shapes[2] == ((2, 3, 16), (2, 7, 16), (2, 1, 1, 7))  # Lq != Lk, odd, padding mask
    assert shapes[3] == ((1, 7, 16), (1, 7, 16), (7, 7))  # a batch of one, odd length
    assert shapes[4][0] == (2, 6, 20)  # a second width: d_k = 5


def test_planted_bug_symptoms_table():
    table = planted_bug_symptoms()
    assert list(table) == list(PLANTED_BUGS)
    for name, line in table.items():
        assert line.startswith("FAIL") and "\n" not in line and line == check_mha(PLANTED_BUGS[name]).symptom
        assert BUG_MESSAGES[name] not in line  # the symptom, not the advice
    assert table["missing_scale"] == "FAIL without a mask (max |diff| = 0.655)"
    assert table["mask_inverted"] == "FAIL with a causal mask (max |diff| = inf)"
    assert table["kv_split_with_query_length"].endswith("forward(query, key, value, mask=mask) raised RuntimeError")
    assert table["scores_returned_as_weights"].startswith("FAIL without a mask (weights: max |diff| = ")


def test_check_mha_leaves_the_global_rng_alone():
    state = torch.random.get_rng_state()
    check_mha(PLANTED_BUGS["wrong_split"])
    check_mha(NotesMHA)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert MHACheck is CheckResult


# ------------------------------------------------------------------------ the engine
def _cumsum(x):
    return x.cumsum(-1)


def _odd_raises(x):
    if x.shape[-1] % 2:
        raise IndexError("odd length")
    return x.cumsum(-1)


MISTAKES = [
    PlantedMistake("wrong_dim", lambda x: x.cumsum(0), "cumsum over the last dimension."),
    PlantedMistake("exclusive", lambda x: x.cumsum(-1) - x, "include the current element."),
    PlantedMistake("odd_lengths", _odd_raises, "handle odd lengths."),
    PlantedMistake("doubled_on_batch_of_one", lambda x: x.cumsum(-1) * (2 if x.shape[0] == 1 else 1), "no special case."),
]
INPUTS = [
    TestInput("a (1, 4) row", (torch.arange(4.0)[None],), "f(x)"),
    TestInput("a (3, 5) batch", (torch.randn(3, 5, generator=torch.Generator().manual_seed(0)),), "f(x)"),
    TestInput("a (2, 6) batch", (torch.randn(2, 6, generator=torch.Generator().manual_seed(1)),), "f(x)"),
]


def test_engine_passes_the_reference():
    r = diagnose(_cumsum, _cumsum, MISTAKES, INPUTS)
    assert r.passed and r.diagnosis is None and r.message.startswith("PASS") and r.inputs == [t.label for t in INPUTS]


@pytest.mark.parametrize("mistake", MISTAKES, ids=lambda m: m.name)
def test_engine_names_every_planted_mistake(mistake):
    r = diagnose(mistake.fn, _cumsum, MISTAKES, INPUTS)
    assert not r.passed and r.diagnosis == mistake.name and r.message.endswith(mistake.advice)


def test_engine_tells_apart_mistakes_that_coincide_on_one_input():
    # On the (1, 4) row cumsum(0) is the identity and differs from both; "doubled" and the learner
    # agree there, so only the other inputs tell them apart.
    learner = lambda x: x.cumsum(-1) * (2 if x.shape[0] == 1 else 1)  # noqa: E731
    decoy = PlantedMistake("doubled_everywhere", lambda x: x.cumsum(-1) * 2, "decoy")
    r = diagnose(learner, _cumsum, [decoy] + MISTAKES, INPUTS)
    assert r.diagnosis == "doubled_on_batch_of_one"


def test_engine_reports_exceptions_and_unknown_differences_without_raising():
    def crashes(x):
        raise ValueError("my bug")

    r = diagnose(crashes, _cumsum, MISTAKES, INPUTS)
    assert not r.passed and r.diagnosis == "exception"
    assert r.message == "FAIL a (1, 4) row: f(x) raised ValueError: my bug" and r.symptom == "FAIL a (1, 4) row: f(x) raised ValueError"
    r = diagnose(lambda x: x.cumsum(-1) + (x.shape[-1] == 5), _cumsum, MISTAKES, INPUTS, unknown_hint="Look again.")
    assert r.diagnosis == "unknown" and r.failed_input == "a (3, 5) batch" and r.max_abs_diff == pytest.approx(1.0, abs=1e-6)
    assert r.message == "FAIL a (3, 5) batch (max |diff| = 1), and no single common mistake reproduces it. Look again."
    r = diagnose(lambda x: x[..., :2], _cumsum, MISTAKES, INPUTS)
    assert r.diagnosis == "shape" and r.symptom == "FAIL a (1, 4) row (shape (1, 2), expected (1, 4))" and r.max_abs_diff == math.inf
    r = diagnose(lambda x: x.cumsum(-1) * float("nan"), _cumsum, MISTAKES, INPUTS)
    assert "The output contains NaN" in r.message


def test_engine_reject_and_exception_types_are_matched():
    def rejects(x):
        raise Reject("interface", "f must return a tensor, got list")

    r = diagnose(rejects, _cumsum, MISTAKES, INPUTS)
    assert r.diagnosis == "interface" and r.message == "FAIL a (1, 4) row: f must return a tensor, got list"
    # raising another exception type on odd lengths is not the planted "odd_lengths" mistake
    def odd_key_error(x):
        if x.shape[-1] % 2:
            raise KeyError("odd")
        return x.cumsum(-1)

    r = diagnose(odd_key_error, _cumsum, MISTAKES, INPUTS)
    assert r.diagnosis == "exception" and r.message.startswith("FAIL a (3, 5) batch: f(x) raised KeyError")


def test_engine_compares_dicts_and_leaves_the_rng_alone():
    ref = lambda x: {"out": x.cumsum(-1), "aux": x.sum(-1)}  # noqa: E731
    state = torch.random.get_rng_state()
    r = diagnose(lambda x: {"out": x.cumsum(-1), "aux": x.sum(-1) + 0.5 + 0 * torch.rand(1)}, ref, [], INPUTS)
    assert r.symptom == "FAIL a (1, 4) row (aux: max |diff| = 0.5)"
    assert torch.equal(torch.random.get_rng_state(), state)
    with pytest.raises(ValueError, match="inputs must list at least one TestInput, got none"):
        diagnose(_cumsum, _cumsum, MISTAKES, [])
