"""The chapters' self-tests (`ddplab.self_tests`): each answer guide's answer is what the lab computes and
is written in the chapter's folded guide, no self-test cell shows it, and a learner's answer gets right or
wrong (too high, too low, which entries differ), never the lab's value or the distance to it."""

import dataclasses
import json
import re
from pathlib import Path

import pytest

from ddplab import recipes, self_tests
from ddplab.verify import CheckFailed

ROOT = Path(__file__).resolve().parents[2]
MEASURED = {"spec": recipes.memory_ledger(world_size=2, local_batch=8, optimizer="adam"),   # notebook 02's `main`
            "all_reduces_per_step": 7, "buckets": 7}   # notebook 06 passes the counts its accum-no-sync run measured


def _values(key):
    return {name: MEASURED[name] for name in self_tests.QUESTIONS[key].needs}


def _notebook(key):
    return next((ROOT / "notebooks").glob(key.split(".")[0] + "_*.ipynb"))


def _cells(key):
    return json.loads(_notebook(key).read_text())["cells"]


@pytest.mark.parametrize("key", self_tests.QUESTIONS)
def test_the_answer_guide_says_what_the_lab_computes_in_the_chapters_folded_guide(key):
    q = self_tests.QUESTIONS[key]
    self_tests.expected(key, **_values(key))   # raises when the guide's answer differs from the lab's
    guides = ["".join(c["source"]) for c in _cells(key)
              if c["cell_type"] == "markdown" and "Answer guide" in "".join(c["source"])]
    assert any(q.phrase in g for g in guides), f"{q.phrase!r} is not in {_notebook(key).name}'s answer guide"


@pytest.mark.parametrize("key", self_tests.QUESTIONS)
def test_no_self_test_cell_shows_the_answer(key):
    q = self_tests.QUESTIONS[key]
    cells = ["".join(c["source"]) for c in _cells(key)
             if c["cell_type"] == "code" and f'self_tests.check("{key}"' in "".join(c["source"])]
    assert len(cells) == 1
    shown = [self_tests.fmt(v) for v in (q.guide if isinstance(q.guide, list) else [q.guide])]
    code = re.sub(r"#.*", "", cells[0])   # the learner's own comments may say "e.g. [1, 2, 3]"
    numbers = re.findall(r"(?<![\w.])\d+(?:\.\d+)?(?![\w.])", code)
    assert "reference" not in cells[0] and q.hint not in cells[0]
    assert not set(numbers) & set(shown), f"the cell shows {set(numbers) & set(shown)}"


def test_a_guide_that_disagrees_with_the_lab_fails_the_notebook(monkeypatch):
    wrong = dataclasses.replace(self_tests.QUESTIONS["03.1"], guide=49)   # forgot the ring's 2(D-1)/D
    monkeypatch.setitem(self_tests.QUESTIONS, "03.1", wrong)
    with pytest.raises(CheckFailed, match="the answer guide says 49, the lab computes 24.5"):
        self_tests.check("03.1", None)


def test_a_learners_answer_never_fails_and_a_wrong_one_hears_its_side_not_the_value(capsys):
    assert self_tests.check("03.1", None) is None
    assert self_tests.check("03.1", 24.5) is True
    assert self_tests.check("03.1", 49) is False
    assert self_tests.check("00.5", (18, 19, 20, 21, 22, 23)) is True   # a tuple for a list
    assert self_tests.check("00.5", [18, 19, 20, 21, 22, 24]) is False
    assert self_tests.check("06.1", [512, 2], **_values("06.1")) is False
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("not answered yet") and out[1].startswith("correct") and "24.5" in out[1]
    assert "you answered 49, too high; hint: the payload G" in out[2] and "24.5" not in out[2]
    assert "entry 6 of 6 differs" in out[4] and "23" not in out[4].split("hint")[0].replace("[18, 19, 20, 21, 22, 24]", "")
    assert "entry 2 of 2 differs" in out[5] and "[512, 1" not in out[5]


def test_a_cell_that_passes_the_wrong_values_is_told_which_ones():
    with pytest.raises(ValueError, match="pass all_reduces_per_step, buckets; missing all_reduces_per_step, buckets"):
        self_tests.check("06.1", None)
    with pytest.raises(ValueError, match="no question '99.1'"):
        self_tests.check("99.1", None)


def test_an_answer_rounded_as_a_learner_rounds_it_is_right_where_the_question_allows(capsys):
    """07.3's answer has four decimals: 252.68 is right, 252.0 is not; a question without a tolerance of
    its own still wants the guide's value."""
    assert self_tests.check("07.3", 252.68) is True
    assert self_tests.check("07.3", 252.0) is False
    assert self_tests.check("03.1", 24.5 * (1 + 1e-4)) is False
