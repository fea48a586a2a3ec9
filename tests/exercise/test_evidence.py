"""The exercise checker's reading of evidence and its report: pure logic, no ranks. The learner's notebook gives
each piece as a template (a dict of `...`); `notebook_templates` reads them, as a learner runs them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import ddplab
from ddplab import Experiment, exercise
from ddplab.exercise import EvidenceFailed, Finding, Report, batch, buckets, comm, gradients, memory, readiness, shape

NOTEBOOK = Path(__file__).resolve().parents[2] / "exercises" / "data_parallel_exercise.ipynb"
EXP = Experiment(name="exercise-shape", world_size=4, local_batch=4, accum_steps=2, steps=2, seq_len=8)
KEYS = {"batch": batch.KEYS, "gradients": gradients.KEYS + gradients.OPTIONAL, "readiness": readiness.KEYS,
        "buckets": buckets.KEYS, "comm": comm.KEYS}


def notebook_templates(exp: Experiment) -> dict:
    """The evidence after running every piece's cell of the learner's notebook as it is handed out."""
    evidence = exercise.template(exp)
    for cell in json.loads(NOTEBOOK.read_text())["cells"]:
        if cell["metadata"].get("nbgrader", {}).get("grade_id") in exercise.PIECES:
            exec("".join(cell["source"]), {"evidence": evidence, "exp": exp})   # noqa: S102 - our own notebook
    return evidence


def shows(message: str, *values) -> bool:
    """Whether `message` states any of `values` as written (a number not inside a longer one)."""
    return any(re.search(rf"(?<![\d.,]){re.escape(str(v))}(?!\d|[.,]\d)", message) for v in values)


def test_the_notebook_templates_hold_every_key_the_checker_reads():
    ev = notebook_templates(EXP)
    for piece, keys in KEYS.items():
        assert set(ev[piece]) == set(keys), piece
    assert set(ev["memory"]) == set(range(EXP.world_size))
    assert all(set(row) == set(memory.CATEGORIES) for row in ev["memory"].values())
    assert EXP.world_size in ev["comm"]["bytes_per_rank"]


def test_the_blank_templates_are_all_todo_and_launch_nothing(monkeypatch):
    def no_launch(*args, **kwargs):
        raise AssertionError("a blank template launched ranks")

    monkeypatch.setattr(ddplab, "run_many", no_launch)
    report = exercise.check(notebook_templates(EXP), progress=False)
    assert [f.ok for f in report.findings] == [None] * len(exercise.PIECES), repr(report)
    assert all(f.message.startswith("not filled in yet") for f in report.findings)


def test_a_template_half_filled_names_the_values_still_todo():
    ev = notebook_templates(EXP)
    ev["batch"]["local_batch"] = [4, 4, 4, 4]
    (todo,) = exercise.judge(ev, {}).of("batch")
    assert todo.ok is None and "batch['accum_steps']" in todo.message and "batch['global_batch']" in todo.message


@pytest.mark.parametrize("piece, written", [("batch", 32), ("batch", {"global_batch": 32}),
                                            ("gradients", {"local_batch": [1, 2, 3, 4], "name": "w", "i": 0}),
                                            ("readiness", ["lm_head.weight", "wte.weight"]), ("comm", 705_024),
                                            ("buckets", {"count": 3, "exposed_ms": 1.5})])
def test_a_shape_error_lists_every_key_the_piece_needs_at_once(piece, written):
    ev = {**exercise.template(EXP), piece: written}
    (found,) = exercise.judge(ev, {}).of(piece)   # a shape error: no run is read
    assert found.check == "shape" and found.ok is False
    assert all(repr(k) in found.message for k in KEYS[piece]), found.message
    assert "description of this piece" not in found.message


def test_a_memory_row_of_the_wrong_shape_lists_every_category():
    ev = {**exercise.template(EXP), "memory": {r: {"params": 1} for r in range(4)}}
    (found,) = exercise.judge(ev, {}).of("memory")
    assert found.check == "shape" and all(repr(c) in found.message for c in memory.CATEGORIES)
    assert "'params'" in found.message   # and what was written instead


@pytest.mark.parametrize("local, accum, g, expected", [([4, 4, 4, 4], 2, 16, 32), ([4, 4, 4, 4], 2, 20, 32),
                                                       ([4, 4, 4, 4], 1, 32, 2), ([4, 4, 4, 5], 2, 32, "[4, 4, 4, 4]")])
def test_a_failing_row_says_what_is_wrong_without_the_expected_value(local, accum, g, expected):
    written = {"local_batch": local, "accum_steps": accum, "global_batch": g}
    failed = exercise.judge({**exercise.template(EXP), "batch": written}, {}).failures("batch")
    assert failed
    for f in failed:
        assert not shows(f.message, expected), f.message


@pytest.mark.parametrize("b", [[3, 2], [5, 4], [2, 1], [1, 2, 3, 4], [4, 4, 4, 5], [2, 6]])
def test_the_hidden_case_always_has_unequal_batches_and_differs_from_yours(b):
    hidden = gradients.hidden_batches(b)
    assert len(set(hidden)) > 1 and hidden != b and len(hidden) == len(b)


def test_shapes_a_learner_may_write_are_read_and_others_named():
    assert shape.batches(4, "x", 3) == [4, 4, 4]
    assert shape.batches(np.array([1, 2]), "x", 2) == [1, 2]
    assert shape.by_rank({"0": 1, 1: 2}, "m") == {0: 1, 1: 2} and shape.by_rank([5, 6], "m") == {0: 5, 1: 6}
    assert shape.number(np.float32(0.5), "v") == 0.5 and shape.integer(np.int64(3), "v") == 3
    for bad, call in [("x[1]", lambda: shape.batches([1, 0.5], "x", 2)),
                      ("x: one positive", lambda: shape.batches([1, 2, 3], "x", 2)),
                      ("keys are rank numbers", lambda: shape.by_rank({"rank0": 1}, "m")),
                      ("expected a number", lambda: shape.number(float("nan"), "v")),
                      ("expected a number", lambda: shape.number(True, "v"))]:
        with pytest.raises(shape.Malformed, match=bad.replace("[", r"\[")):
            call()


def test_a_report_passes_only_when_every_check_held():
    r = Report([Finding("batch", "a", True, "fine"), Finding("memory", "b", False, "divided"),
                Finding("comm", "c", None, "not filled in yet")])
    assert r.passed("batch") and not r.passed("memory") and not r.passed("comm") and not r.passed()
    r.assert_passed("batch")
    with pytest.raises(EvidenceFailed, match="memory: divided"):
        r.assert_passed("memory")
    with pytest.raises(ValueError, match="pieces"):
        r.assert_passed("memroy")
    assert ">FAIL</b>" in r._repr_html_() and "FAIL memory" in repr(r)
