"""What every notebook cell promises the learner: checks say what they verified
(`ddplab.verify`, never a bare assert that fails with no numbers), and nbval's instructions live in
cell tags, not in comments the learner has to read past."""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "exercises").glob("**/*.ipynb"))


def _code_cells(path):
    nb = json.loads(path.read_text())
    return [c for c in nb["cells"] if c["cell_type"] == "code"]


def _problems(path) -> list[str]:
    problems = []
    for i, cell in enumerate(_code_cells(path)):
        src = "".join(cell["source"])
        if "NBVAL" in src:
            problems.append(f"code cell {i}: an nbval comment in the source (use the cell's tags)")
        if re.search(r"^\s*assert\b", src, re.MULTILINE):
            problems.append(f"code cell {i}: a bare assert (use ddplab.verify: it says what it checked)")
        tags = cell.get("metadata", {}).get("tags", [])
        unknown = [t for t in tags if t.startswith("nbval") and t not in
                   ("nbval-check-output", "nbval-ignore-output", "nbval-skip", "nbval-raises-exception")]
        if unknown:
            problems.append(f"code cell {i}: unknown nbval tag(s) {unknown}")
    return problems


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_checks_speak_and_nbval_instructions_are_tags(path):
    assert _problems(path) == []


def test_the_rule_catches_a_bare_assert_and_an_nbval_comment(tmp_path):
    bad = {"cells": [{"cell_type": "code", "metadata": {}, "source": ["# NBVAL_CHECK_OUTPUT\n", "x = 1"]},
                     {"cell_type": "code", "metadata": {"tags": ["nbval-chek-output"]}, "source": ["assert x == 1"]}]}
    (tmp_path / "bad.ipynb").write_text(json.dumps(bad))
    problems = _problems(tmp_path / "bad.ipynb")
    assert len(problems) == 3, problems


def test_some_cells_are_compared_by_nbval():
    tagged = [p.name for p in NOTEBOOKS for c in _code_cells(p)
              if "nbval-check-output" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) >= 5, tagged


def _lines(cell) -> int:
    return len("".join(cell["source"]).rstrip("\n").split("\n"))


def test_notebook_05_reads_as_a_lesson_short_cells():
    """Notebook 05's code cells hold at most 8 lines (logic lives in library calls), its
    markdown cells at most 15."""
    nb = json.loads((ROOT / "notebooks" / "05_buckets_and_overlap.ipynb").read_text())
    long = [(i, c["cell_type"], _lines(c)) for i, c in enumerate(nb["cells"])
            if _lines(c) > (8 if c["cell_type"] == "code" else 15)]
    assert long == []


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks").glob("*.ipynb")), ids=lambda p: p.name)
def test_every_chapter_has_a_collapsible_knowledge_check_and_a_blank_self_test(path):
    """The answer guide is folded (<details>), and the self-test cell leaves the learner's answer at None
    (`tests/notebooks/test_self_tests.py` checks the guide's answer against the lab's; a learner fills in theirs)."""
    cells = json.loads(path.read_text())["cells"]
    md = ["".join(c["source"]) for c in cells if c["cell_type"] == "markdown"]
    assert any("<details>" in s and "Answer guide" in s for s in md)
    tests = ["".join(c["source"]) for c in _code_cells(path) if "self_tests.check(" in "".join(c["source"])]
    assert tests and all(re.search(r"^my_\w+ = None\b", s, re.MULTILINE) for s in tests)


def _output_text(o) -> str:
    return "".join(o.get("text", [])) + "".join("".join(v) if isinstance(v, list) else str(v)
                                               for k, v in o.get("data", {}).items() if k.startswith("text/"))


@pytest.mark.parametrize("path", [*sorted((ROOT / "notebooks").glob("*.ipynb")), ROOT / "exercises" / "data_parallel_exercise.ipynb"],
                         ids=lambda p: p.name)
def test_stored_outputs_hold_no_progress_bars_and_no_empty_outputs(path):
    """A learner opening a chapter sees what the run said, not a frozen bar per rank or blank
    outputs (progress.Reporter replaces a notebook's bars with the run's final line)."""
    cells = json.loads(path.read_text())["cells"]
    bars = [i for i, c in enumerate(cells) for o in c.get("outputs", []) if re.search(r"rank \d+: +\d+%\|", _output_text(o))]
    empty = [i for i, c in enumerate(cells) for o in c.get("outputs", [])
             if o["output_type"] in ("stream", "display_data", "execute_result") and not _output_text(o).strip()
             and not any(k.startswith(("image/", "application/")) for k in o.get("data", {}))]
    assert (bars, empty) == ([], [])


# a timing claim's verdict (`ddplab.claims`), an open question's answer, or a line quoting what a run saw;
# `ddplab.verify`'s "verified: ... (seen X, expected Y)" lines are checks, not verdicts, and are not held to it
VERDICT_LINE = re.compile(r"^\s*(?:holds|contradicted|cannot resolve|this run's (?:answer|finding))\b"
                          r"|^(?!\s*(?:NOT )?verified: ).*\(seen ")
LONGEST_VERDICT = 120   # characters: a verdict is read in one line; its statistics are folded beneath it
LONGEST_CHECK = 200     # characters: a check says its claim and what it saw; a longer one folds the values beneath


def _plain_text(o) -> str:
    """What an output says as text: a stream's text, or the text/plain of a displayed value (a verdict's line
    and its statistics beneath it; its HTML holds the same line, escaped)."""
    text = o.get("text", o.get("data", {}).get("text/plain", ""))
    return "".join(text) if isinstance(text, list) else str(text)


def stored_output_problems(path) -> list[str]:
    """What a learner opening the stored notebook would trip on: a verdict line too long to read at a glance, a
    check's line that dumps its values (`verify` folds what was seen beneath a long claim),
    "contradicted" in a cell that passed (only a claim that failed its cell is called that), and a file cited
    in an output that the repository does not have."""
    from tests.test_citations import missing_citations

    problems = []
    for i, cell in enumerate(_code_cells(path)):
        outputs = cell.get("outputs", [])
        text = "\n".join(_plain_text(o) for o in outputs if o["output_type"] != "error")
        problems += [f"code cell {i}: a verdict of {len(line.strip())} characters: {line.strip()[:80]}..."
                     for line in text.splitlines() if VERDICT_LINE.search(line) and len(line.strip()) > LONGEST_VERDICT]
        problems += [f"code cell {i}: a check's line of {len(line)} characters: {line[:80]}..."
                     for line in text.splitlines() if line.startswith("verified: ") and len(line) > LONGEST_CHECK]
        if "contradicted" in text and not any(o["output_type"] == "error" for o in outputs):
            problems.append(f"code cell {i}: says 'contradicted' in a cell that passed")
        problems += [f"code cell {i}: cites {m}" for m in missing_citations(text)]
    return problems


@pytest.mark.parametrize("path", [*sorted((ROOT / "notebooks").glob("*.ipynb")), ROOT / "exercises" / "data_parallel_exercise.ipynb"],
                         ids=lambda p: p.name)
def test_stored_verdicts_read_in_one_line_and_only_a_failed_claim_says_contradicted(path):
    assert stored_output_problems(path) == []


def test_the_stored_output_rule_catches_each_problem(tmp_path):
    def cell(text, error=False):
        outs = [{"output_type": "stream", "name": "stdout", "text": [text]}]
        return {"cell_type": "code", "metadata": {}, "source": ["x"],
                "outputs": outs + ([{"output_type": "error", "ename": "CheckFailed", "evalue": "", "traceback": []}]
                                   if error else [])}
    shown = {"output_type": "display_data", "metadata": {},
             "data": {"text/html": ["<details><summary>holds: " + "b" * 120], "text/plain": ["holds: " + "b" * 120]}}
    nb = {"cells": [cell("holds: " + "a" * 120 + "\n"), cell("holds: short (seen +1 ms)\n"),
                    cell("contradicted: x (seen +1 ms)\n"), cell("contradicted: x (seen +1 ms)\n", error=True),
                    cell("see " + "notes/" + "ddp-internals.md and docs/layout.md\n"),
                    {"cell_type": "code", "metadata": {}, "source": ["x"], "outputs": [shown]},
                    cell("x -> y: the tail " + "c" * 110 + " (seen +1 ms)\n"),
                    cell("verified: short claim (seen [" + "d, " * 80 + "], expected [...])\n")]}
    (tmp_path / "nb.ipynb").write_text(json.dumps(nb))
    problems = stored_output_problems(tmp_path / "nb.ipynb")
    assert [p.split(":")[0] for p in problems] == ["code cell 0", "code cell 2", "code cell 4", "code cell 5",
                                                   "code cell 6", "code cell 7"], problems


MAIN_PATH_WORDS = 3000   # a chapter's prose a learner reads straight through; detail is folded (<details>)


def main_path_words(path) -> int:
    """Words of a notebook's markdown outside its folded sections."""
    cells = json.loads(Path(path).read_text())["cells"]
    text = "\n".join(re.sub(r"<details>.*?</details>", "", "".join(c["source"]), flags=re.S)
                     for c in cells if c["cell_type"] == "markdown")
    return len(re.findall(r"[A-Za-z][\w'-]*", text))


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks").glob("*.ipynb")), ids=lambda p: p.name)
def test_a_chapters_main_path_is_at_most_3000_words(path):
    assert main_path_words(path) <= MAIN_PATH_WORDS


def test_folded_prose_is_not_counted(tmp_path):
    nb = {"cells": [{"cell_type": "markdown", "metadata": {}, "source": ["one two\n<details><summary>x</summary>\n\n",
                                                                       "three four five\n</details>\nsix"]}]}
    (tmp_path / "nb.ipynb").write_text(json.dumps(nb))
    assert main_path_words(tmp_path / "nb.ipynb") == 3
