"""Worked solutions folded in markdown ``<details>`` blocks render folded in JupyterLab (issue 23):
the element is there, it is not ``open``, its code is hidden until the summary is clicked, and the
fenced code inside it is rendered as code (a ``<pre>``), not as raw text. GitHub and nbviewer fold
the same HTML; ``tests/test_solutions.py`` runs the code."""
from __future__ import annotations

import nbformat

from .conftest import scratch_notebook

SOLUTION = ("<details>\n<summary><b>Solution to exercise 1</b> (click to show)</summary>\n\n"
            "```python\nanswer = 6 * 7\nassert answer == 42\n```\n\nSome prose after the code.\n\n</details>\n")


def test_a_details_solution_renders_folded_in_jupyterlab(lab, browser):
    cells = [nbformat.v4.new_markdown_cell("# A solution folded\n\n## Exercises\n\n1. What is 6 x 7?"),
             nbformat.v4.new_markdown_cell(SOLUTION)]
    with scratch_notebook(lab, browser, "_details_folded_check.ipynb", cells) as page:
        details = page.locator(".jp-MarkdownCell .jp-RenderedMarkdown details")
        details.first.wait_for(state="attached", timeout=60_000)
        assert details.count() == 1
        state = details.first.evaluate("(d) => ({open: d.open, summary: d.querySelector('summary').innerText, "
                                       "pre: d.querySelectorAll('pre').length, code: d.querySelector('pre') && "
                                       "d.querySelector('pre').textContent})")
        assert state["open"] is False, state
        assert state["summary"].startswith("Solution to exercise 1"), state
        assert state["pre"] == 1 and "answer = 6 * 7" in state["code"], f"the fence was not rendered as code: {state}"
        code = details.first.locator("pre")
        assert not code.is_visible(), "the solution's code is visible before the summary is clicked"
        details.first.locator("summary").click()
        code.wait_for(state="visible", timeout=10_000)
        assert details.first.evaluate("(d) => d.open") is True
