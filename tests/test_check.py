"""Tests of helpers.check: the MHA exercise checker passes the solution and names each planted bug."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from helpers.attention import MultiHeadAttention
from helpers.check import BUG_MESSAGES, PLANTED_BUGS, SCAFFOLD, NotesMHA, check_mha


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


@pytest.mark.parametrize("bug", ["missing_scale", "wrong_merge", "mask_inverted"])
def test_diagnosis_holds_at_other_sizes(bug):
    r = check_mha(PLANTED_BUGS[bug], d_model=24, num_heads=3, seq=4, seed=3)
    assert r.diagnosis == bug


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
    assert check_mha(ReturnsTensorOnly).passed
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
