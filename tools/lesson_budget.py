"""How long a notebook's lesson is: the core path's words, long sentences, code, and a study time.

    python tools/lesson_budget.py                       # every notebook, one line each
    python tools/lesson_budget.py --sections notebooks/03_mha_from_scratch.ipynb
    python tools/lesson_budget.py --long notebooks/02_rope_efficient.ipynb   # list the long sentences
    python tools/lesson_budget.py --json
    python tools/lesson_budget.py --write-readme   # the README table's study-time column, from these numbers
    python tools/lesson_budget.py --write-headers notebooks/NN_x.ipynb   # the "Study time." line of its first cell

The **core path** is what a learner studies (CONTRIBUTING.md, "The frame of a notebook"): every cell
except those in a section whose heading carries the marker ``(optional · 选读)`` (down to the next
heading of the same or a higher level), and, inside markdown, except what sits in ``<details>`` folds,
HTML comments, or display math. Notebooks under ``notebooks/appendix/`` are evidence, not core: they are
counted as "everything" only.

Study time, from stated reading speeds (a learner reading technical English as a second language):
English prose 100 words/min (an inline formula counts as a word and 5 s more); Chinese 300 characters/min;
a display formula 0.5 min; code 8 lines/min
(read) plus 0.2 min to run each cell; printed output 20 lines/min; a figure 1 min; an exercise written
from memory 30 min, any other exercise 15 min (the learners' reads of 2026-12-01 measured 20-40 min for
the first and 8-25 min for the second), unless the exercise states its own time in its first line,
"(45–60 min)", which then counts at its upper bound. The core time counts the core path; "everything" counts every cell, folds and
optional sections included.

This is project tooling (not part of ``helpers``); ``tests/test_lesson_frame.py`` enforces its budget.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

OPTIONAL_MARKER = "(optional · 选读)"
ROOT = Path(__file__).resolve().parent.parent

# Reading speeds (per minute) and fixed costs (minutes): the stated basis of every study time.
WORDS_PER_MIN = 100
CJK_CHARS_PER_MIN = 300
MIN_PER_FORMULA = 0.5
MIN_PER_INLINE_FORMULA = 5 / 60
CODE_LINES_PER_MIN = 8
OUTPUT_LINES_PER_MIN = 20
MIN_PER_FIGURE = 1.0
MIN_PER_FROM_MEMORY_EXERCISE = 30.0
MIN_PER_EXERCISE = 15.0
STATED_MINUTES_RE = re.compile(r"\((?:about\s+)?(\d+)(?:\s*[–-]\s*(\d+))?\s*min\b")
MIN_PER_CELL_RUN = 0.2

# The budget of a core path (issue 29; enforced by tests/test_lesson_frame.py).
MAX_CORE_WORDS = 3500
MAX_LONG_SENTENCES = 5
LONG_SENTENCE_WORDS = 40
MAX_MEDIAN_CODE_LINES = 10

# Narration about machines, runs and reviews: never in learner prose or in what a core cell prints.
NARRATION = [
    r"\bthis machine\b", r"\bour machine\b", r"\bon the course machine\b",
    r"\bruns? made for this notebook\b", r"\bin the runs made\b",
    r"\ba reviewer\b", r"\bthe reviewer\b", r"\breviewers?\s+(?:found|said|noted|asked)\b",
    r"\ba fresh review\b", r"\ban earlier review\b", r"\bthe review found\b",
]
NARRATION_RE = re.compile("|".join(NARRATION), re.IGNORECASE)

CJK_RE = re.compile(r"[\u3400-\u9fff\uf900-\ufaff\u3000-\u303f\uff00-\uffef「」]")
HEADING_RE = re.compile(r"^(#{1,6})\s+(.*)$")
DETAILS_RE = re.compile(r"<details\b.*?</details>", re.DOTALL | re.IGNORECASE)
COMMENT_RE = re.compile(r"<!--.*?-->", re.DOTALL)
DISPLAY_MATH_RE = re.compile(r"\$\$.*?\$\$|\\begin\{(equation|align)\*?\}.*?\\end\{\1\*?\}", re.DOTALL)
INLINE_MATH_RE = re.compile(r"\$[^$\n]+\$")
FENCE_RE = re.compile(r"```.*?```", re.DOTALL)
TAG_RE = re.compile(r"</?[a-zA-Z][^>]*>")
# Abbreviations whose full stop does not end a sentence.
ABBREV = ["e.g.", "i.e.", "et al.", "vs.", "cf.", "Fig.", "Eq.", "approx.", "resp.", "No.", "etc.)"]


@dataclass
class Section:
    title: str
    optional: bool
    words: int = 0
    cjk_chars: int = 0
    long_sentences: int = 0
    code_cells: int = 0
    code_lines: int = 0


@dataclass
class Budget:
    notebook: str
    core_words: int = 0
    core_cjk_chars: int = 0
    core_formulas: int = 0
    long_sentences: list[str] = field(default_factory=list)
    core_code_cells: int = 0
    core_code_lines: list[int] = field(default_factory=list)
    core_output_lines: int = 0
    core_figures: int = 0
    exercise_numbers: set = field(default_factory=set)
    from_memory_numbers: set = field(default_factory=set)
    stated_minutes: dict = field(default_factory=dict)  # exercise number -> the time its first line states
    core_inline_formulas: int = 0
    all_inline_formulas: int = 0
    narration: list[str] = field(default_factory=list)
    all_words: int = 0
    all_cjk_chars: int = 0
    all_formulas: int = 0
    all_code_lines: int = 0
    all_code_cells: int = 0
    all_output_lines: int = 0
    all_figures: int = 0
    appendix: bool = False
    sections: list[Section] = field(default_factory=list)

    @property
    def median_code_lines(self) -> float:
        return statistics.median(self.core_code_lines) if self.core_code_lines else 0.0

    @property
    def exercises(self) -> int:
        return len(self.exercise_numbers)

    @property
    def from_memory_exercises(self) -> int:
        return len(self.from_memory_numbers)

    @property
    def exercise_minutes(self) -> float:
        total = 0.0
        for n in self.exercise_numbers:
            if n in self.stated_minutes:
                total += self.stated_minutes[n]
            elif n in self.from_memory_numbers:
                total += MIN_PER_FROM_MEMORY_EXERCISE
            else:
                total += MIN_PER_EXERCISE
        return total

    @property
    def core_minutes(self) -> float:
        if self.appendix:
            return 0.0
        return (self.core_words / WORDS_PER_MIN + self.core_cjk_chars / CJK_CHARS_PER_MIN
                + self.core_formulas * MIN_PER_FORMULA + self.core_inline_formulas * MIN_PER_INLINE_FORMULA
                + sum(self.core_code_lines) / CODE_LINES_PER_MIN + self.core_code_cells * MIN_PER_CELL_RUN
                + self.core_output_lines / OUTPUT_LINES_PER_MIN + self.core_figures * MIN_PER_FIGURE
                + self.exercise_minutes)

    @property
    def all_minutes(self) -> float:
        return (self.all_words / WORDS_PER_MIN + self.all_cjk_chars / CJK_CHARS_PER_MIN
                + self.all_formulas * MIN_PER_FORMULA + self.all_inline_formulas * MIN_PER_INLINE_FORMULA
                + self.all_code_lines / CODE_LINES_PER_MIN
                + self.all_code_cells * MIN_PER_CELL_RUN
                + self.all_output_lines / OUTPUT_LINES_PER_MIN + self.all_figures * MIN_PER_FIGURE
                + self.exercise_minutes)


def _strip_markup(text: str) -> tuple[str, int, int]:
    """Markdown to countable prose: (text, display formulas removed, inline formulas)."""
    text = COMMENT_RE.sub(" ", text)
    formulas = len(DISPLAY_MATH_RE.findall(text))
    text = DISPLAY_MATH_RE.sub(" ", text)
    text = FENCE_RE.sub(" ", text)
    inline = len(INLINE_MATH_RE.findall(text))
    text = INLINE_MATH_RE.sub(" MATH ", text)
    text = TAG_RE.sub(" ", text)
    return text, formulas, inline


def count_words(text: str) -> tuple[int, int]:
    """(English words, CJK characters) of prose: a word is a whitespace token with a letter or digit."""
    cjk = len(CJK_RE.findall(text))
    latin = CJK_RE.sub(" ", text)
    words = sum(1 for tok in latin.split() if re.search(r"[A-Za-z0-9]", tok))
    return words, cjk


def sentences(text: str) -> list[str]:
    """Split prose into sentences: paragraphs, list items and table rows first, then full stops."""
    out = []
    for block in re.split(r"\n\s*\n|\n(?=\s*(?:[-*+]|\d+\.)\s)|\n(?=\s*\|)|\n(?=#)", text):
        block = " ".join(block.split())
        if not block or block.startswith("#") or block.startswith("|"):
            continue
        protected = block
        for i, abbr in enumerate(ABBREV):
            protected = protected.replace(abbr, abbr.replace(".", f"\x00{i}"))
        # a full stop, or a full stop closed by a bracket or a quote ("(An English rendering.) Next"), then a capital
        for part in re.split(r"(?:(?<=[.!?])|(?<=[.!?][)\]”’\"']))\s+(?=[A-Z(\"'`*\[“‘0-9§])|(?<=[。！？])", protected):
            part = re.sub(r"\x00\d+", ".", part).strip()
            if part:
                out.append(part)
    return out


def _source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _outputs(cell) -> tuple[int, int, str]:
    """(printed lines, figures, printed text) of a code cell's committed outputs."""
    lines, figures, text = 0, 0, []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            t = "".join(out.get("text", ""))
        else:
            data = out.get("data", {})
            if "image/png" in data or "image/svg+xml" in data:
                figures += 1
                continue
            t = "".join(data.get("text/plain", "")) if "text/plain" in data else ""
            if "application/vnd.jupyter.widget-view+json" in data:
                t = ""
        text.append(t)
        lines += sum(1 for line in t.splitlines() if line.strip())
    return lines, figures, "\n".join(text)


def _stated(b: "Budget", number: int, first_line: str) -> None:
    """An exercise whose first line states its time, "(20 min)" or "(45–60 min)", counts at the upper bound."""
    m = STATED_MINUTES_RE.search(first_line)
    if m:
        b.stated_minutes[number] = float(m.group(2) or m.group(1))


def measure(path: Path) -> Budget:
    nb = json.loads(Path(path).read_text(encoding="utf-8"))
    appendix = "appendix" in Path(path).parts
    b = Budget(notebook=Path(path).name, appendix=appendix)
    stack: list[tuple[int, bool]] = []  # (heading level, optional) of the open headings
    section = Section(title="(before the first heading)", optional=appendix)
    b.sections.append(section)
    in_exercises = False
    for cell in nb["cells"]:
        src = _source(cell)
        if cell["cell_type"] == "markdown":
            # A heading opens a section; a cell may hold several headings: split it at each.
            # Lines inside a code fence or a <details> fold are never headings.
            chunks, current, fenced, folds = [], [], False, 0
            for line in src.splitlines():
                if HEADING_RE.match(line) and current and not fenced and folds == 0:
                    chunks.append("\n".join(current))
                    current = []
                current.append(line)
                if line.lstrip().startswith("```"):
                    fenced = not fenced
                folds += len(re.findall(r"<details\b", line, re.IGNORECASE)) - len(re.findall(r"</details>", line, re.IGNORECASE))
            chunks.append("\n".join(current))
            for chunk in chunks:
                first = chunk.splitlines()[0] if chunk else ""
                m = HEADING_RE.match(first)
                if m:
                    level, title = len(m.group(1)), m.group(2).strip()
                    while stack and stack[-1][0] >= level:
                        stack.pop()
                    parent_optional = any(opt for _, opt in stack)
                    optional = appendix or parent_optional or OPTIONAL_MARKER in title
                    stack.append((level, optional))
                    section = Section(title=title, optional=optional)
                    b.sections.append(section)
                    if level <= 2:
                        in_exercises = title.lower().startswith("exercises")
                    if level >= 3 and re.match(r"exercises?\b", title, re.IGNORECASE) and not optional:
                        number = re.match(r"exercise\s+(\d+)\b", title, re.IGNORECASE)
                        if number:  # "### Exercise 6: ..." and the list item "6." are one exercise
                            b.exercise_numbers.add(int(number.group(1)))
                            if re.search(r"from memory|默写", title, re.IGNORECASE):
                                b.from_memory_numbers.add(int(number.group(1)))
                            _stated(b, int(number.group(1)), title)
                self_core = not section.optional
                # Everything: folds included.
                all_text, all_f, all_i = _strip_markup(chunk)
                b.all_inline_formulas += all_i
                w, c = count_words(all_text)
                b.all_words, b.all_cjk_chars, b.all_formulas = b.all_words + w, b.all_cjk_chars + c, b.all_formulas + all_f
                if not self_core:
                    continue
                core_chunk = DETAILS_RE.sub(" ", chunk)
                if in_exercises and not section.title.lower().startswith("exercise "):
                    for n, first_line in re.findall(r"^(\d+)\.\s(.*)$", core_chunk, re.MULTILINE):
                        b.exercise_numbers.add(int(n))
                        if re.search(r"from memory|默写", first_line, re.IGNORECASE):
                            b.from_memory_numbers.add(int(n))
                        _stated(b, int(n), first_line)
                text, f, inline = _strip_markup(core_chunk)
                b.core_inline_formulas += inline
                w, c = count_words(text)
                b.core_words += w
                b.core_cjk_chars += c
                b.core_formulas += f
                section.words += w
                section.cjk_chars += c
                for s in sentences(text):
                    if count_words(s)[0] > LONG_SENTENCE_WORDS:
                        b.long_sentences.append(s)
                        section.long_sentences += 1
                for hit in NARRATION_RE.finditer(text):
                    b.narration.append(f"{section.title}: ...{text[max(0, hit.start() - 40):hit.end() + 40]}...")
        elif cell["cell_type"] == "code":
            n_lines = sum(1 for line in src.splitlines() if line.strip())
            out_lines, figs, printed = _outputs(cell)
            b.all_code_lines += n_lines
            b.all_code_cells += 1
            b.all_output_lines += out_lines
            b.all_figures += figs
            if section.optional:
                continue
            b.core_code_cells += 1
            b.core_code_lines.append(n_lines)
            b.core_output_lines += out_lines
            b.core_figures += figs
            section.code_cells += 1
            section.code_lines += n_lines
            for hit in NARRATION_RE.finditer(printed):
                b.narration.append(f"{section.title} (printed): ...{printed[max(0, hit.start() - 40):hit.end() + 40]}...")
    return b


def budget_problems(b: Budget) -> list[str]:
    """What breaks the core path's budget (an empty list when it is kept)."""
    problems = []
    if b.core_words > MAX_CORE_WORDS:
        problems.append(f"{b.core_words} core prose words (at most {MAX_CORE_WORDS})")
    if len(b.long_sentences) > MAX_LONG_SENTENCES:
        problems.append(f"{len(b.long_sentences)} core sentences over {LONG_SENTENCE_WORDS} words "
                        f"(at most {MAX_LONG_SENTENCES}); see --long")
    if b.median_code_lines > MAX_MEDIAN_CODE_LINES:
        problems.append(f"median core code cell {b.median_code_lines:g} lines (at most {MAX_MEDIAN_CODE_LINES})")
    if b.narration:
        problems.append("narration about machines, runs or reviews in learner prose: " + " | ".join(b.narration))
    return problems


def hours(minutes: float) -> str:
    return f"{minutes / 60:.1f} h"


def notebooks() -> list[Path]:
    # the named lessons and appendices, not a hidden committed copy (tools/pristine.py)
    return (sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
            + sorted((ROOT / "notebooks" / "appendix").glob("[0-9][0-9]*_*.ipynb")))


def readme_cell(b: Budget) -> str:
    return f"{b.core_minutes / 60:.1f} h core · {b.all_minutes / 60:.1f} h all"


def write_readme(results: list[Budget], readme: Path = ROOT / "README.md") -> int:
    """Rewrite the study-time column (the 4th) of the README's notebook table; return the rows changed."""
    by_number = {r.notebook[:2]: r for r in results if not r.appendix}
    lines, changed = readme.read_text(encoding="utf-8").splitlines(keepends=True), 0
    for i, line in enumerate(lines):
        m = re.match(r"^\| (\d\d) \|", line)
        if m and m.group(1) in by_number:
            cols = line.rstrip("\n").split(" | ")
            new = readme_cell(by_number[m.group(1)])
            if cols[3] != new:
                cols[3] = new
                lines[i] = " | ".join(cols) + "\n"
                changed += 1
    readme.write_text("".join(lines), encoding="utf-8")
    return changed


STUDY_LINE = re.compile(r"(core path about )\d+(?:\.\d)?( h, everything about )\d+(?:\.\d)?( h)")
APPENDIX_LINE = re.compile(r"(all optional, about )\d+(?:\.\d)?( h)")


def write_header(path: Path) -> bool:
    """Put the tool's numbers into the first cell's study-time line; True if the file changed.

    Only the numbers of an existing line change (a lesson's ``core path about X h, everything about Y h``,
    an appendix's ``all optional, about Y h``); the notebook is written back as nbformat writes it."""
    b = measure(path)
    raw = Path(path).read_text(encoding="utf-8")
    nb = json.loads(raw)
    cell = nb["cells"][0]
    src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
    if b.appendix:
        new = APPENDIX_LINE.sub(lambda m: f"{m.group(1)}{b.all_minutes / 60:.1f}{m.group(2)}", src)
    else:
        new = STUDY_LINE.sub(lambda m: f"{m.group(1)}{b.core_minutes / 60:.1f}{m.group(2)}{b.all_minutes / 60:.1f}{m.group(3)}", src)
    if new == src:
        return False
    cell["source"] = new.splitlines(keepends=True)
    Path(path).write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="*", type=Path)
    ap.add_argument("--sections", action="store_true", help="one line per section as well")
    ap.add_argument("--long", action="store_true", help="print the core sentences over 40 words")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--write-readme", action="store_true", help="rewrite README.md's study-time column")
    ap.add_argument("--write-headers", action="store_true", help="rewrite the study-time line of each notebook's first cell")
    args = ap.parse_args(argv)
    paths = args.paths or notebooks()
    results = [measure(p) for p in paths]
    if args.write_headers:
        for p in paths:
            # twice: the line's own words count, so the numbers settle after one more pass
            changed = write_header(p) | write_header(p)
            print(f"{p}: {'study-time line rewritten' if changed else 'unchanged'}")
        return 0
    if args.write_readme:
        print(f"README.md: {write_readme(results)} study-time cells rewritten")
        return 0
    if args.json:
        print(json.dumps([{**{k: v for k, v in asdict(r).items() if k != "sections"},
                           "core_minutes": round(r.core_minutes, 1), "all_minutes": round(r.all_minutes, 1),
                           "median_code_lines": r.median_code_lines, "exercises": r.exercises,
                           "from_memory_exercises": r.from_memory_exercises} for r in results],
                         ensure_ascii=False, indent=1, default=sorted))
        return 0
    print(f"{'notebook':44} {'words':>6} {'中文':>5} {'>40w':>5} {'cells':>5} {'med':>4} {'core':>6} {'all':>6}")
    for r in results:
        print(f"{r.notebook:44} {r.core_words:6d} {r.core_cjk_chars:5d} {len(r.long_sentences):5d} "
              f"{r.core_code_cells:5d} {r.median_code_lines:4g} {hours(r.core_minutes):>6} {hours(r.all_minutes):>6}")
        if args.sections:
            for s in r.sections:
                mark = "  (optional)" if s.optional else ""
                print(f"    {s.title[:60]:60} {s.words:5d} w {s.cjk_chars:4d} 字 {s.long_sentences:2d} long "
                      f"{s.code_cells:2d} cells {s.code_lines:4d} lines{mark}")
        if args.long:
            for s in r.long_sentences:
                print(f"    [{count_words(s)[0]} words] {s}")
        for p in budget_problems(r) if not r.appendix else []:
            print(f"    over budget: {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
