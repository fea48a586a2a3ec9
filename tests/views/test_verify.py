"""Every notebook check says what it verified, and fails with expected versus seen."""

import math

import pandas as pd
import pytest

from ddplab import verify
from ddplab.verify import CheckFailed


def test_sequences_of_any_kind_compare_by_their_elements(capsys):
    import numpy as np

    verify.equal("tuple vs list", pd.Series([1, 2]), (1, 2))
    verify.equal("array vs list", [1, 2], np.array([1, 2]))
    verify.below("0-d array", np.array(0.5), 1.0)
    verify.that("numpy bool", np.bool_(True))
    assert len(capsys.readouterr().out.splitlines()) == 4
    with pytest.raises(TypeError, match="DataFrame"):
        verify.below("a frame", pd.DataFrame({"a": [1.0]}), 2.0)


def test_a_check_that_holds_prints_what_it_verified(capsys):
    verify.equal("four ranks", [0, 1, 2, 3], [0, 1, 2, 3])
    verify.below("DDP step is the global step", pd.Series([1e-8, 3e-8]), 1e-5)
    verify.above("independent steps differ", [0.2, 0.05], 1e-2)
    verify.between("efficiency", 0.7, 0.5, 1.0)
    verify.close("mean of locals", [1.0, 2.0], [1.0, 2.0 + 1e-9])
    verify.that("all identical", pd.Series([True, True]))
    out = capsys.readouterr().out.splitlines()
    assert out == ["verified: four ranks (seen [0, 1, 2, 3], expected [0, 1, 2, 3])",
                   "verified: DDP step is the global step (seen at most 3e-08 over 2, expected < 1e-05)",
                   "verified: independent steps differ (seen at least 0.05 over 2, expected > 0.01)",
                   "verified: efficiency (seen 0.7, expected within [0.5, 1])",
                   "verified: mean of locals (seen relative error at most 5e-10 over 2, expected 2 values within 1e-06 relative)",
                   "verified: all identical (seen true, expected true)"]


@pytest.mark.parametrize("call, message", [
    (lambda: verify.equal("four ranks", [0, 1, 2], [0, 1, 2, 3]), "four ranks: expected [0, 1, 2, 3], seen [0, 1, 2]"),
    (lambda: verify.below("small", pd.Series([1e-8, 0.031]), 1e-5), "small: expected < 1e-05, seen 0.031 (the largest of 2)"),
    (lambda: verify.below("small", [math.nan], 1e-5), "expected < 1e-05, seen nan"),
    (lambda: verify.above("big", [0.2, 0.001], 1e-2), "big: expected > 0.01, seen 0.001 (the smallest of 2)"),
    (lambda: verify.between("in range", 1.5, 0.5, 1.0), "in range: expected within [0.5, 1], seen 1.5"),
    (lambda: verify.close("same", [1.0, 2.5], [1.0, 2.0]), "seen 2.5 where 2 was due (the worst of 2)"),
    (lambda: verify.close("same", [1.0], [1.0, 2.0]), "expected 2 values, seen 1"),
    (lambda: verify.that("all identical", pd.Series([True, False])), "all identical: expected true, seen false"),
    (lambda: verify.that("speedup", False, seen=0.8, expected="> 1"), "speedup: expected > 1, seen 0.8"),
    (lambda: verify.below("empty", [], 1.0), "nothing to check"),
    (lambda: verify.that("every one", [False, False]), "every one: expected true, seen false"),   # a list is truthy
    (lambda: verify.that("every one", (x > 0 for x in [1, -1])), "seen false"),
    (lambda: verify.that("every one", pd.Series([], dtype=bool)), "seen false"),   # vacuous .all()
    (lambda: verify.below("small", [1.0, math.nan], 5), "seen nan (value 2 of 2)"),
    (lambda: verify.between("in range", [1.0, math.nan, 0.7], 0.5, 1.0), "seen nan (value 2 of 3)"),
])
def test_a_check_fed_a_wrong_value_fails_saying_expected_versus_seen(call, message):
    with pytest.raises(CheckFailed, match="NOT verified|nothing to check") as info:
        call()
    assert message in str(info.value)
    assert isinstance(info.value, AssertionError)
    assert info.value._render_traceback_() == [f"CheckFailed: {info.value}"]   # one line in a notebook


def test_a_long_check_prints_its_claim_with_seen_and_expected_folded_and_long_values_cut(capsys):
    from ddplab.folded import Folded

    names = [[f"blocks.{i}.mlp.{j}.weight" for j in range(8)] for i in range(8)]
    verify.equal("that bucket holds every parameter", names, names)
    line = capsys.readouterr().out.strip()
    assert line.startswith("verified: that bucket holds every parameter (seen [[blocks.0.mlp.0.weight")
    assert "characters)" in line and len(line) < 2 * verify.CUT + 120   # each value cut at CUT characters
    shown = []
    import ddplab.verify as v
    orig = v.show
    try:
        v.show = lambda folded, plain=None: shown.append((folded, plain))
        verify.equal("that bucket holds every parameter", names, names)
    finally:
        v.show = orig
    folded, plain = shown[0]
    assert isinstance(folded, Folded) and folded.lines == "verified: that bucket holds every parameter"
    assert folded.details.startswith("seen [[blocks.0") and "\nexpected [[blocks.0" in folded.details and plain == line
    verify.equal("four ranks", 4, 4)   # a short one stays one printed line
    assert capsys.readouterr().out == "verified: four ranks (seen 4, expected 4)\n"


def test_a_close_check_names_its_error_relative_or_absolute(capsys):
    verify.close("zero due", 1e-9, 0.0, abs_=1e-6)
    verify.close("mixed", [1e-9, 2.0], [0.0, 2.0], abs_=1e-6)
    verify.close("one due", 2.002, 2.0, rel=1e-2)
    out = capsys.readouterr().out.splitlines()
    assert out == ["verified: zero due (seen 1e-09, absolute error 1e-09, expected 0 within 1e-06 relative + 1e-06)",
                   "verified: mixed (seen error (relative where nonzero was due) at most 1e-09 over 2, "
                   "expected 2 values within 1e-06 relative + 1e-06)",
                   "verified: one due (seen 2, relative error 0.001, expected 2 within 0.01 relative)"]
