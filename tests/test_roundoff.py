"""helpers.lab.roundoff prints a rounding error in the one shape that tests/nbval_sanitize.cfg masks."""
from __future__ import annotations

import configparser
import math
import re
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from helpers.lab.roundoff import ROUNDOFF_TAG, roundoff

SANITIZE = Path(__file__).resolve().parent / "nbval_sanitize.cfg"


def _patterns() -> list[tuple[str, str]]:
    cfg = configparser.ConfigParser()
    cfg.read(SANITIZE)
    return [(cfg[s]["regex"], cfg[s]["replace"]) for s in cfg.sections()]


def _sanitize(text: str) -> str:
    for regex, replace in _patterns():
        text = re.sub(regex, replace, text)
    return text


def test_format():
    assert roundoff(2.4e-7) == "2.4e-07 [round-off]"
    assert roundoff(4.44e-16) == "4.4e-16 [round-off]"
    assert roundoff(0) == "0 [round-off]"
    assert roundoff(0.0) == "0 [round-off]"
    assert roundoff(torch.tensor(1.5e-5)) == "1.5e-05 [round-off]"
    assert roundoff(torch.tensor([[3e-8]], dtype=torch.float64)) == "3.0e-08 [round-off]"


@given(st.floats(min_value=-1e3, max_value=1e3, allow_nan=False, allow_infinity=False))
def test_every_value_is_masked_to_one_text(err):
    """Whatever the CPU's rounding makes of a value, the sanitized text is the same."""
    assert _sanitize(f"max |diff| = {roundoff(err)} (asserted < 1e-5)") == \
        "max |diff| = ROUNDOFF [round-off] (asserted < 1e-5)"


def test_two_cpus_print_the_same_after_sanitizing():
    # the decade moves (9.9e-17 vs 1.0e-16) and a difference is exactly 0 on one CPU only
    for a, b in [(9.9e-17, 1.0e-16), (0.0, 2.4e-7), (1.49e-7, 5.96e-8)]:
        assert roundoff(a) != roundoff(b)
        assert _sanitize(roundoff(a)) == _sanitize(roundoff(b))


def test_sanitize_leaves_other_numbers_alone():
    text = ("PASS max |diff| < 1e-12 (asserted); val acc 0.973 +- 0.021; 1e-5; 4.8e-7; "
            "shape (2, 4, 256, 64); 0 of 8 seeds; 2.4e-07 without its tag")
    assert _sanitize(text) == text


@pytest.mark.parametrize("bad, exc, words", [
    (float("nan"), ValueError, "finite"),
    (float("inf"), ValueError, "finite"),
    (torch.tensor(float("nan")), ValueError, "finite"),
    ("1e-7", TypeError, "real number"),
    (True, TypeError, "real number"),
    (torch.zeros(2), TypeError, "one-element"),
    (torch.tensor(1j), TypeError, "one-element"),
])
def test_bad_input_is_refused_by_name(bad, exc, words):
    with pytest.raises(exc, match=words):
        roundoff(bad)
    with pytest.raises(exc, match="err"):
        roundoff(bad)


def test_tag_is_what_the_sanitize_file_masks():
    assert any(re.fullmatch(regex, roundoff(2.4e-7)) and ROUNDOFF_TAG in replace for regex, replace in _patterns())
    assert math.isclose(float(roundoff(3.14159e-9).split()[0]), 3.1e-9)
