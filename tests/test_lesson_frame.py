"""The frame of a notebook (CONTRIBUTING.md, "The frame of a notebook"), and the budget of its core path.

The notebooks listed in FRAMED have been rewritten to the frame; a notebook joins the list when it is.
`tools/lesson_budget.py` measures; these tests enforce.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
import lesson_budget as lb  # noqa: E402
from pristine import pristine  # noqa: E402  (tools/pristine.py: the committed copy of a notebook the learner edited)

NOTEBOOK_DIR = REPO / "notebooks"
FRAMED = ["01_rope_rotation_matrix.ipynb", "02_rope_efficient.ipynb", "03_mha_from_scratch.ipynb",
          "04_regularization.ipynb", "05_head_redundancy.ipynb", "06_positional_encodings_compared.ipynb", "07_from_scratch_to_huggingface.ipynb",
          "08_attention_cost_flashattention.ipynb"]
MAIN = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
APPENDIX = sorted((NOTEBOOK_DIR / "appendix").glob("[0-9][0-9]*_*.ipynb"))  # not a hidden committed copy
NOTES_DIR = REPO.parent / "shared" / "notes"
GLOSSARY = REPO / "GLOSSARY.md"
CJK = re.compile(r"[\u3400-\u9fff]")
# Terms a learner looked up and did not find (../shared/reviews/2026-12-01/learner-day.md), and the frame's own.
REQUIRED_TERMS = [
    "memory-bound", "compute-bound", "stride", "contiguous", "fused kernel", "broadcast", "autocast",
    "censored", "Kaplan-Meier", "paired test", "Wilcoxon", "sign test", "teacher forcing",
    "summation by parts", "upper bound", "cross-attention", "encoder", "decoder",
    "rotary position embedding", "causal mask", "multi-head attention", "round-off", "core path",
]


def _cells(path: Path) -> list[dict]:
    return json.loads(pristine(path).read_text(encoding="utf-8"))["cells"]


def _src(cell: dict) -> str:
    s = cell.get("source", "")
    return "".join(s) if isinstance(s, list) else s


def _markdown(path: Path) -> str:
    return "\n\n".join(_src(c) for c in _cells(path) if c["cell_type"] == "markdown")


def _notes() -> str:
    files = sorted(NOTES_DIR.glob("*.txt"))
    if not files:
        pytest.skip(f"the study notes are not beside the repository ({NOTES_DIR}): quotes cannot be checked")
    return "\n".join(f.read_text(encoding="utf-8") for f in files)


# ----------------------------------------------------------------- the tool itself, on notebooks made here
def _nb(tmp_path: Path, cells: list[tuple[str, str]], name="01_x.ipynb") -> Path:
    nb = {"nbformat": 4, "nbformat_minor": 5, "metadata": {},
          "cells": [{"cell_type": t, "metadata": {}, "source": s, **({"outputs": [], "execution_count": None} if t == "code" else {})}
                    for t, s in cells]}
    p = tmp_path / name
    p.write_text(json.dumps(nb), encoding="utf-8")
    return p


def test_tool_counts_core_words_outside_folds_and_optional_sections(tmp_path):
    p = _nb(tmp_path, [
        ("markdown", "# Title\n\nOne two three."),
        ("markdown", "## 1. Core\n\nFour five.\n\n<details><summary>Folded</summary>\n\nsix seven eight nine</details>"),
        ("code", "x = 1\n\ny = 2\n"),
        ("markdown", f"## 2. Deep {lb.OPTIONAL_MARKER}\n\nten eleven"),
        ("markdown", "### 2a. Still optional\n\ntwelve thirteen"),
        ("code", "z = 3\n" * 30),
        ("markdown", "## 3. Core again\n\nfourteen 中文字"),
    ])
    b = lb.measure(p)
    # Title(1) + One two three(3) + "1. Core"(2) + Four five(2) + "3. Core again"(3) + fourteen(1); folds and optional out
    assert b.core_words == 12, b.core_words
    assert b.core_cjk_chars == 3
    assert b.core_code_cells == 1 and b.core_code_lines == [2]
    assert b.all_code_lines == 32
    assert [s.optional for s in b.sections] == [False, False, False, True, True, False]
    assert b.all_words > b.core_words


def test_tool_sees_no_heading_inside_a_code_fence_or_a_fold(tmp_path):
    p = _nb(tmp_path, [("markdown", "## 1. S\n\nCore.\n\n<details><summary>Solution</summary>\n\n```python\n# a comment\nx = 1\n```\n"
                                    "folded words here\n\n# not a heading in a fold\n</details>\n\nAfter.")])
    b = lb.measure(p)
    assert [s.title for s in b.sections] == ["(before the first heading)", "1. S"]
    assert b.core_words == 4  # "1. S", "Core.", "After."


def test_tool_finds_long_sentences_and_keeps_abbreviations(tmp_path):
    long = " ".join(["word"] * 41) + "."
    short = "This is short, e.g. a case. Another one."
    p = _nb(tmp_path, [("markdown", f"## 1. S\n\n{long} {short}\n\n- a list item\n- another item")])
    b = lb.measure(p)
    assert len(b.long_sentences) == 1
    assert "e.g. a case." in lb.sentences(short)[0]
    assert len(lb.sentences(short)) == 2
    quoted = "「中文。」 (The English rendering, in brackets.) The next sentence."
    assert lb.sentences(quoted)[-2:] == ["」 (The English rendering, in brackets.)", "The next sentence."]
    assert lb.budget_problems(b) == []
    p2 = _nb(tmp_path, [("markdown", "## 1. S\n\n" + "\n\n".join([long] * 6))], name="02_y.ipynb")
    assert any("sentences over 40" in x for x in lb.budget_problems(lb.measure(p2)))


def test_tool_flags_narration_in_prose_and_in_core_output(tmp_path):
    p = _nb(tmp_path, [("markdown", "## 1. S\n\nOn this machine it took 3 s.")])
    assert lb.measure(p).narration
    p2 = _nb(tmp_path, [("markdown", "## 1. S\n\n<details><summary>How this was measured</summary>\n\non this machine</details>")],
             name="02_y.ipynb")
    assert not lb.measure(p2).narration
    nb = json.loads(p2.read_text())
    nb["cells"].append({"cell_type": "code", "metadata": {}, "execution_count": 1, "source": "print(1)",
                        "outputs": [{"output_type": "stream", "name": "stdout", "text": "in the runs made for this notebook: 3\n"}]})
    p2.write_text(json.dumps(nb))
    assert any("printed" in n for n in lb.measure(p2).narration)


def test_tool_counts_exercises_and_times_them(tmp_path):
    p = _nb(tmp_path, [
        ("markdown", "## Exercises\n\n1. First.\n2. Second.\n\n<details><summary>Hint</summary>\n\n1. not one</details>"),
        ("markdown", "4. **The update, from memory.** Write it."),
        ("markdown", "### Exercise 3: R_m from memory\n\nWrite it."),
        ("markdown", "### Exercise 2: also a list item\n\nCounted once."),
    ])
    b = lb.measure(p)
    assert (b.exercises, b.from_memory_exercises) == (4, 2)  # a list item "from memory" counts as one too
    assert b.exercise_minutes == 2 * lb.MIN_PER_EXERCISE + 2 * lb.MIN_PER_FROM_MEMORY_EXERCISE


def test_tool_uses_an_exercise_s_stated_time(tmp_path):
    p = _nb(tmp_path, [
        ("markdown", "## Exercises\n\n1. Plain (45–60 min). Do it.\n2. Plain, no time.\n3. **From memory** (20 min).\n"
                     "4. Long (90 min)\n   a second line (5 min) is not read."),
        ("markdown", "### Exercise 5: the cache from memory (about 40 min)\n\nWrite it."),
    ])
    b = lb.measure(p)
    assert b.stated_minutes == {1: 60.0, 3: 20.0, 4: 90.0, 5: 40.0}
    assert b.exercise_minutes == 60 + lb.MIN_PER_EXERCISE + 20 + 90 + 40


# ----------------------------------------------------------------- the framed notebooks
@pytest.mark.parametrize("name", FRAMED)
def test_core_path_within_budget(name):
    b = lb.measure(pristine(NOTEBOOK_DIR / name))
    assert lb.budget_problems(b) == [], f"{name}: " + "; ".join(lb.budget_problems(b)) + \
        f" (python tools/lesson_budget.py --sections --long notebooks/{name})"


@pytest.mark.parametrize("name", FRAMED)
def test_header_states_computed_study_time_prerequisites_and_glossary(name):
    head = _src(_cells(NOTEBOOK_DIR / name)[0])
    b = lb.measure(pristine(NOTEBOOK_DIR / name))
    m = re.search(r"\*\*Study time\.\*\*[^\n]*?core path about (\d+(?:\.\d)?) h, everything about (\d+(?:\.\d)?) h", head)
    assert m, f"{name}: the first cell must state '**Study time.** core path about X.X h, everything about Y.Y h'"
    core, everything = float(m.group(1)), float(m.group(2))
    assert abs(core - b.core_minutes / 60) <= 0.15 and abs(everything - b.all_minutes / 60) <= 0.15, (
        f"{name}: stated {core} h / {everything} h, the tool computes {b.core_minutes / 60:.2f} h / {b.all_minutes / 60:.2f} h")
    assert "**Prerequisites.**" in head, f"{name}: the first cell must name its prerequisites"
    assert "GLOSSARY.md" in head, f"{name}: the first cell must link the glossary"


@pytest.mark.parametrize("name", FRAMED)
def test_opens_with_the_notes_questions(name):
    cells = _cells(NOTEBOOK_DIR / name)
    opener = _src(cells[1])
    assert cells[1]["cell_type"] == "markdown" and opener.startswith("## Your questions · 你的疑问"), (
        f"{name}: the cell after the title must be '## Your questions · 你的疑问'")
    quotes = re.findall(r"「([^」]+)」", opener)
    assert len(quotes) >= 2, f"{name}: the opener quotes the notes (「...」)"
    items = [line for line in opener.splitlines() if line.lstrip().startswith(("- ", "* "))]
    assert items and all(re.search(r"\]\(#[\w-]+\)", it) for it in items), (
        f"{name}: every question links to the section that answers it")


@pytest.mark.parametrize("name", FRAMED + [p.relative_to(NOTEBOOK_DIR).as_posix() for p in APPENDIX])
def test_quotes_of_the_notes_are_verbatim(name):
    notes = _notes()
    for q in re.findall(r"「([^」]+)」", _markdown(NOTEBOOK_DIR / name)):
        assert q in notes, f"{name}: 「{q}」 is not in the notes as written"


@pytest.mark.parametrize("name", FRAMED + [p.relative_to(NOTEBOOK_DIR).as_posix() for p in APPENDIX])
def test_section_links_resolve(name):
    text = _markdown(NOTEBOOK_DIR / name)
    anchors = set(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", text))
    for target in re.findall(r"\]\(#([^)\s]+)\)", text):
        assert target in anchors, f"{name}: link #{target} has no <a id=\"{target}\"> in the notebook"


@pytest.mark.parametrize("name", FRAMED)
def test_every_numbered_core_section_opens_with_its_summary(name):
    b_sections = 0
    for cell in _cells(NOTEBOOK_DIR / name):
        src = _src(cell)
        if cell["cell_type"] != "markdown":
            continue
        for m in re.finditer(r"^## (\d+[a-z]?)\. (.*)$", src, re.MULTILINE):
            if lb.OPTIONAL_MARKER in m.group(2):
                continue
            b_sections += 1
            after = src[m.end():].lstrip("\n")
            after = re.sub(r"^<a\s[^>]*></a>\s*", "", after)
            assert after.startswith("**本节要点**"), f"{name} §{m.group(1)}: must open with **本节要点**"
            summary = after.split("\n\n")[0]
            n = summary.count("。")
            assert 1 <= n <= 3 and len(CJK.findall(summary)) >= 20, (
                f"{name} §{m.group(1)}: 本节要点 is 2-3 Chinese sentences (found {n} '。')")
    assert b_sections >= 4, f"{name}: found only {b_sections} numbered core sections"


@pytest.mark.parametrize("path", APPENDIX, ids=lambda p: p.name)
def test_appendix_notebooks_are_linked_from_their_lesson(path):
    linked = any(f"appendix/{path.name}" in _markdown(nb) for nb in MAIN)
    assert linked, f"no notebook links appendix/{path.name}"
    assert "GLOSSARY.md" in _src(_cells(path)[0])


# ----------------------------------------------------------------- the glossary, the README, fonts
def _glossary_rows() -> list[list[str]]:
    rows = []
    for line in GLOSSARY.read_text(encoding="utf-8").splitlines():
        if line.startswith("|") and not re.match(r"^\|\s*-", line) and not line.startswith("| English"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def test_glossary_rows_are_complete():
    rows = _glossary_rows()
    assert len(rows) >= 60
    for r in rows:
        assert len(r) == 4 and all(r), f"GLOSSARY.md row needs English | 中文 | meaning | where: {r}"
        assert CJK.search(r[1]), f"GLOSSARY.md: no Chinese for {r[0]!r}"
        assert re.fullmatch(r"\d\d(?:[a-z])?(?:, \d\d(?:[a-z])?)*|README|all", r[3]), f"GLOSSARY.md: 'where' of {r[0]!r} is {r[3]!r}"
    english = [r[0].lower() for r in rows]
    assert len(set(english)) == len(english), "GLOSSARY.md: a term is listed twice"
    for term in REQUIRED_TERMS:
        assert any(term.lower() in e for e in english), f"GLOSSARY.md lacks {term!r}"


@pytest.mark.parametrize("path", MAIN, ids=lambda p: p.name)
def test_every_notebook_links_the_glossary(path):
    assert "GLOSSARY.md" in _src(_cells(path)[0]), f"{path.name}: link GLOSSARY.md from the first cell"


def test_readme_study_times_come_from_the_tool():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    for path in MAIN:
        b = lb.measure(pristine(path))
        row = next((line for line in readme.splitlines() if line.startswith(f"| {path.name[:2]} |")), None)
        assert row, f"README has no row for {path.name}"
        m = re.search(r"(\d+\.\d) h core · (\d+\.\d) h all", row)
        assert m, f"README row {path.name[:2]}: study time must read 'X.X h core · Y.Y h all'"
        assert abs(float(m.group(1)) - b.core_minutes / 60) <= 0.15 and abs(float(m.group(2)) - b.all_minutes / 60) <= 0.15, (
            f"README row {path.name[:2]}: {m.group(0)}, the tool computes {b.core_minutes / 60:.1f} / {b.all_minutes / 60:.1f} h")
    assert "fonts-noto-cjk" in readme, "README must name the CJK font package"


PLOT_TEXT = re.compile(r"(set_title|set_xlabel|set_ylabel|suptitle|\.text\(|annotate|legend|label=|title=|xlabel|ylabel)")


def test_figures_carry_no_chinese_text():
    """Chinese in a figure needs a CJK font the learner may lack (□□□): figures keep English labels."""
    files = [(p.name, p.read_text(encoding="utf-8")) for p in sorted((REPO / "helpers" / "viz").glob("*.py"))]
    for nb in MAIN + APPENDIX:
        files += [(f"{nb.name} cell {i}", _src(c)) for i, c in enumerate(_cells(nb)) if c["cell_type"] == "code"]
    for where, src in files:
        for line in src.splitlines():
            if PLOT_TEXT.search(line) and CJK.search(line):
                pytest.fail(f"{where}: Chinese text in a figure: {line.strip()}")


@pytest.mark.parametrize("name", FRAMED)
def test_displayed_explorers_are_not_moved_by_later_cells(name):
    """After Run All an explorer must still show the frame its caption describes: later cells that move sliders
    from code use a second instance, never the displayed one."""
    cells = _cells(NOTEBOOK_DIR / name)
    shown = []
    for i, c in enumerate(cells):
        if c["cell_type"] != "code":
            continue
        texts = ["".join(o.get("data", {}).get("text/plain", "")) for o in c.get("outputs", [])]
        last = _src(c).strip().splitlines()[-1].strip() if _src(c).strip() else ""
        if any(t.startswith("Explorer:") for t in texts) and re.fullmatch(r"[A-Za-z_]\w*", last):
            shown.append((i, last))
    assert shown, f"{name}: no displayed explorer found"
    for i, var in shown:
        for j, c in enumerate(cells[i + 1:], start=i + 1):
            if c["cell_type"] == "code" and re.search(rf"\b{var}\s*\.\s*(set|controls|_on_change)\b", _src(c)):
                pytest.fail(f"{name}: cell {j} moves the displayed explorer {var!r}; use a second instance")
