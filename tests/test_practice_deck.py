"""The practice deck (helpers.practice.deck): one card per checker, each with prompt, scaffold and hint."""
import re
from pathlib import Path

import pytest

from helpers.practice.deck import CARDS, DECK, PracticeError, card

PRACTICE = Path(__file__).resolve().parent.parent / "helpers" / "practice"
NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def _checkers_in_source() -> set[str]:
    found = set()
    for path in PRACTICE.glob("*.py"):
        for name in re.findall(r"^def (check_\w+)\(", path.read_text(encoding="utf-8"), flags=re.M):
            found.add(f"helpers.practice.{path.stem}:{name}")
    return found


def test_every_checker_of_the_series_is_a_card():
    on_cards = {c.checker for spec in DECK for c in spec.checks}
    assert on_cards == _checkers_in_source(), "a new check_* needs one entry in helpers/practice/deck.py DECK"
    assert len(DECK) == 13 and len(CARDS) == 13


@pytest.mark.parametrize("spec", DECK, ids=[c.id for c in DECK])
def test_card_is_complete(spec):
    assert spec.prompt and spec.hint and spec.title
    assert (NOTEBOOKS / spec.notebook).exists(), spec.notebook
    for name in spec.names:  # the scaffold defines what the checker asks for
        assert re.search(rf"^(def|class) {name}\b", spec.scaffold, flags=re.M), (spec.id, name)


def test_unknown_card_names_the_deck_and_a_close_match():
    with pytest.raises(PracticeError, match=r"unknown card 'mhaa'.*rotation_matrix.*Did you mean 'mha'"):
        card("mhaa")


# Each card's worked solution (the topic module's), imported under the name the card asks for.
SOLUTIONS = {
    "rotation_matrix": "from helpers.practice.rope import rotation_matrix_solution as R_m",
    "rope_interleaved": "from helpers.practice.rope import rope_interleaved_solution as rope_interleaved",
    "rope_half": "from helpers.practice.rope import rope_half_solution as rope_half",
    "causal_sdpa": "from helpers.practice.attention import causal_sdpa_solution as attention",
    "mha": "from helpers.practice.mha import NotesMHA as MyMHA",
    "dropout": "from helpers.practice.regularization import dropout_solution as my_dropout",
    "label_smoothing": "from helpers.practice.regularization import LABEL_SMOOTHING_SOLUTIONS as S\n"
                       "my_ls_uniform, my_ls_others = S['uniform'], S['others']",
    "head_importance": "from helpers.practice.heads import head_importance_solution as my_importance",
    "sinusoidal": "from helpers.practice.positional import sinusoidal_solution as my_sinusoidal",
    "alibi_slopes": "from helpers.practice.positional import alibi_slopes_solution as my_alibi_slopes",
    "kv_decode_step": "from helpers.practice.kvcache import kv_decode_step_solution as my_decode_step",
    "online_softmax_update": "from helpers.practice.flash import online_softmax_update_solution as my_update",
    "merge_partials": "from helpers.practice.flash import merge_partials_solution as my_merge",
}


@pytest.mark.parametrize("spec", DECK, ids=[c.id for c in DECK])
def test_worked_solution_passes_and_blank_scaffold_fails(spec):
    from helpers.practice.runner import evaluate_source

    good = evaluate_source(spec, SOLUTIONS[spec.id])
    assert good["error"] is None and good["missing"] is None
    assert len(good["verdicts"]) == len(spec.checks) and all(v["passed"] for v in good["verdicts"]), good
    blank = evaluate_source(spec, spec.scaffold)
    assert blank["missing"] is None and not all(v["passed"] for v in blank["verdicts"]), (spec.id, blank)
