"""The audit's reading of evidence and its report: pure logic, no ranks."""

from __future__ import annotations

import numpy as np
import pytest

from ddplab.audit import AuditFailed, Finding, Report, gradients, shape


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
    with pytest.raises(AuditFailed, match="memory: divided"):
        r.assert_passed("memory")
    with pytest.raises(ValueError, match="pieces"):
        r.assert_passed("memroy")
    assert ">FAIL</b>" in r._repr_html_() and "FAIL memory" in repr(r)
