"""The timing-claim judge (ddplab.claims): its false-contradiction rate on heavy-tailed null noise, and
each outcome reached on synthetic data built to give it (no launch)."""

import json
import math
import random

import pytest

from ddplab import claims, references
from ddplab.verify import CheckFailed


def _heavy(rng: random.Random) -> float:
    """Student-t with 2 degrees of freedom (infinite variance), plus an occasional 20x outlier."""
    t = rng.gauss(0, 1) / math.sqrt((rng.gauss(0, 1) ** 2 + rng.gauss(0, 1) ** 2) / 2)
    return t * (20 if rng.random() < 0.05 else 1)


@pytest.mark.parametrize("n", [10, 12, 20, 41])
def test_a_true_claim_on_its_edge_is_contradicted_at_most_one_time_in_a_thousand(n):
    rng = random.Random(n)
    draws = 4000
    contradicted = sum(claims.judge("null", [_heavy(rng) for _ in range(n)], above=0.0).contradicted
                       for _ in range(draws))
    # the designed rate is <= 0.001; a binomial(4000, 0.001) exceeds 12 with probability < 1e-3
    assert contradicted <= 12, f"{contradicted} of {draws} null draws contradicted"
    assert claims.median_interval([_heavy(rng) for _ in range(n)])[1] > -math.inf


def test_the_interval_is_the_sign_test_order_statistics():
    median, low, high = claims.median_interval(range(1, 11))
    assert (median, low, high) == (5.5, 1.0, 10.0)        # n = 10: 1/1024 <= 0.001, so the extremes
    assert claims.median_interval(range(9))[1:] == (-math.inf, math.inf)
    assert claims.min_rounds() == 10
    _, low, high = claims.median_interval(range(100))
    assert 30 < low < 40 and 60 < high < 70


def test_each_outcome_is_reached_and_only_contradicted_fails():
    rng = random.Random(1)
    effect = [20 + rng.gauss(0, 1) for _ in range(12)]
    assert claims.judge("shorter", effect, above=0).holds
    assert claims.judge("longer", effect, below=0).contradicted
    noise = [rng.gauss(0, 5) for _ in range(12)]
    v = claims.judge("noise", noise, above=0)
    assert v.outcome == "cannot resolve" and ("measured values" in v.advice or "edge" in v.advice)
    assert claims.judge("few", effect[:5], above=0).outcome == "cannot resolve"
    v = claims.judge("noise", noise, above=0)
    claims.check(v)
    assert v.outcome == "cannot resolve"
    with pytest.raises(CheckFailed, match="NOT verified: contradicted: longer"):
        claims.check(claims.judge("longer", effect, below=0))


def test_a_band_holds_inside_and_is_contradicted_outside():
    rng = random.Random(2)
    near_one = [1 + rng.gauss(0, 0.01) for _ in range(20)]
    assert claims.judge("slope", near_one, within=(0.9, 1.1)).holds
    assert claims.judge("slope", [x - 0.5 for x in near_one], within=(0.9, 1.1)).contradicted
    assert claims.judge("slope", [x - 0.1 for x in near_one], within=(0.9, 1.1)).outcome == "cannot resolve"


def test_paired_arms_and_ratios():
    a, b = [10.0 + i for i in range(12)], [5.0 + i for i in range(12)]
    assert claims.paired("a slower", a, b, above=0).center == 5.0
    r = claims.paired("a twice b?", [2 * x for x in b], b, ratio=True, within=(1.9, 2.1))
    assert r.holds and r.unit == ""
    with pytest.raises(ValueError, match="a, b"):
        claims.paired("x", a, b[:3], above=0)


def test_an_estimate_uses_a_normal_interval():
    assert claims.estimate("slope one", 1.0, 0.02, within=(0.9, 1.1)).holds
    assert claims.estimate("slope one", 0.5, 0.02, within=(0.9, 1.1)).contradicted
    assert claims.estimate("slope one", 0.85, 0.1, within=(0.9, 1.1)).outcome == "cannot resolve"
    v = claims.estimate("slope one", 1.0, 0.02, within=(0.9, 1.1))
    assert (v.high - v.center) / 0.02 == pytest.approx(3.0902, abs=1e-3)      # z at 0.999


def test_bad_claims_are_refused():
    with pytest.raises(ValueError, match="claim"):
        claims.judge("x", [1.0] * 12, above=0, below=1)
    with pytest.raises(ValueError, match="values"):
        claims.judge("x", [float("nan")] * 12, above=0)
    with pytest.raises(ValueError, match="within"):
        claims.judge("x", [1.0] * 12, within=(2, 1))


# ---- reference runs: shown beside an unresolved claim, never deciding it -----------------------------
def _store(tmp_path, line="holds: the split shortens the tail (median of 24 paired differences -4.1 ms, 99.8% interval [-5, -3] ms)"):
    path = tmp_path / "claims.json"
    path.write_text(json.dumps({
        "runs": {"05@x": {"machine": "2 cores, test CPU", "load": "0.3 at start", "date": "2026-12-03",
                          "commit": "abc1234", "links": {"bucket-sweep-w2": "emulated link 1GbE (50 us, 1 Gb/s)"}}},
        "claims": {references.claim_key("the split shortens the tail (by 4.1 ms)"): {"run": "05@x", "line": line,
                                                                              "outcome": "holds"}}}))
    return path


def test_a_claim_is_keyed_by_its_text_with_every_number_blanked():
    assert references.claim_key("rank 1 waits (12.5 ms, 3e-05 x)") == references.claim_key("rank 1 waits (7 ms, 0.25 x)")
    assert references.claim_key("the split shortens the tail") != references.claim_key("the split lengthens the tail")
    # numbers outside parentheses name what is claimed: another rank, plan or stage count is another claim
    assert references.claim_key("rank 1 joins after rank 0") != references.claim_key("rank 0 joins after rank 1")
    assert references.claim_key("ddp:64 is faster") != references.claim_key("ddp:0.25 is faster")


def test_the_reference_line_says_it_is_not_this_run_and_where_it_came_from(tmp_path):
    line = references.reference("the split shortens the tail (by 9.9 ms)", _store(tmp_path))
    assert line == "a reference run (not this run, 2026-12-03) resolved it: holds (seen -4.1 ms)"
    source = references.reference_source("the split shortens the tail (by 9.9 ms)", _store(tmp_path))
    for part in ("2 cores, test CPU", "load 0.3", "1GbE", "2026-12-03", "abc1234"):
        assert part in source
    assert references.reference("some other claim", _store(tmp_path)) == ""
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert references.reference("the split shortens the tail", bad) == ""


def test_check_shows_the_reference_only_beside_an_unresolved_claim_and_keeps_this_runs_outcome(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(references, "REFERENCES", _store(tmp_path))
    noise = [(-1) ** i * (i + 1.0) for i in range(12)]
    v = claims.judge("the split shortens the tail (by 1 ms)", noise, below=0)
    claims.check(v)
    out = capsys.readouterr().out
    assert v.outcome == "cannot resolve" and out.startswith("cannot resolve") and "reference run" in out
    claims.check(claims.judge("the split shortens the tail (by 1 ms)", [-5.0 - i for i in range(12)], below=0))
    assert "reference run" not in capsys.readouterr().out
    with pytest.raises(CheckFailed):   # a stored "holds" cannot rescue a contradicted claim
        claims.check(claims.judge("the split shortens the tail (by 1 ms)", [5.0 + i for i in range(12)], below=0))


def test_check_writes_each_verdict_down_when_asked(tmp_path, monkeypatch, capsys):
    out = tmp_path / "verdicts.jsonl"
    monkeypatch.setenv("DDPLAB_RECORD_CLAIMS", str(out))
    claims.check(claims.judge("x above 0 (by 2 ms)", [2.0 + i for i in range(12)], above=0))
    row = json.loads(out.read_text())
    assert row["outcome"] == "holds" and row["key"] == references.claim_key("x above 0 (by 5 ms)") and row["line"].startswith("holds")


def test_a_finding_is_printed_as_this_runs_answer_and_never_fails():
    v = claims.judge("b beats a (per step)", [5.0 + i for i in range(12)], below=0)
    assert v.contradicted
    line = claims.finding(v)
    assert line.startswith("this run's answer, no, the opposite: b beats a (seen +10.5 ms)") and "contradicted" not in line
    assert claims.answer(v) == "no, the opposite"


def test_a_verdict_reads_in_one_line_and_folds_its_statistics():
    v = claims.paired("the split shortens the tail (1GbE link) (split minus uncut, per step)",
                      [1.0 + i for i in range(12)], [5.0 + i for i in range(12)], below=0)
    line = str(v)
    assert line == "holds: the split shortens the tail (1GbE link) (seen -4 ms)"   # what names the claim stays
    assert v.measured == "split minus uncut, per step" and "interval" not in line and "\n" not in line
    for part in ("measured: split minus uncut, per step", "median of 12 paired differences -4 ms", "99.8% interval",
                 "the claim: < 0 ms"):
        assert part in v.details()
    html = v._repr_html_()
    assert html.startswith("<details><summary><code>holds: the split") and "99.8% interval" in html
    assert repr(v).splitlines()[0] == line and all(x.startswith("    ") for x in repr(v).splitlines()[1:])
    ratio = claims.paired("a is slower than b (per-step ratio)", [2.0] * 12, [1.0] * 12, ratio=True, above=1)
    assert str(ratio) == "holds: a is slower than b (seen 2x)" and ratio.is_ratio
    assert "paired ratios 2, 99.8% interval [2, 2]; the claim: > 1" in ratio.details()   # a ratio has no sign
    weak = claims.judge("x shrinks [the weakest of 3 pairs: 3 hold]", [(-1) ** i * (i + 1.0) for i in range(12)], below=0)
    assert str(weak) == "cannot resolve: x shrinks (seen -0.5 ms, noise too wide)"
    assert "to resolve it: " in weak.details() and "weakest of 3 pairs" in weak.details()


def test_a_contradicted_claim_fails_with_its_line_and_statistics():
    with pytest.raises(CheckFailed) as failed:
        claims.check(claims.judge("x shrinks (per step)", [5.0 + i for i in range(12)], below=0))
    assert str(failed.value).startswith("NOT verified: contradicted: x shrinks (seen +10.5 ms)")
    assert "99.8% interval" in str(failed.value)


def test_the_weakest_of_several_verdicts_is_a_contradiction_then_an_unresolved_then_the_nearest_by_choice():
    a = claims.family(5)
    held = [claims.judge(f"x{i}", [i + 1.0 + k for k in range(14)], above=0, alpha=a) for i in range(3)]
    noise = claims.judge("noise", [(-1) ** k * (k + 1.0) for k in range(14)], above=0, alpha=a)
    wrong = claims.judge("wrong", [-5.0 - k for k in range(14)], above=0, alpha=a)
    assert claims.weakest([*held, noise, wrong]) is wrong and claims.weakest([*held, noise]) is noise
    assert claims.weakest(held, then=lambda v: v.low) is held[0]


def test_a_family_of_claims_at_full_alpha_each_is_refused():
    """k claims at ALPHA each would be contradicted by chance up to k times as often as one check."""
    full = [claims.judge(f"x{i}", [1.0 + k for k in range(12)], above=0) for i in range(2)]
    with pytest.raises(ValueError, match=r"claims.family\(2\)"):
        claims.weakest(full)
    assert claims.weakest(full[:1]) is full[0] and claims.family(4) == claims.ALPHA / 4


def test_a_true_family_is_contradicted_by_chance_at_most_alpha():
    """4 true claims (median exactly on the edge: the worst case), heavy-tailed noise, judged as one
    family: "contradicted" at most ALPHA of the time over thousands of null draws."""
    rng = random.Random(7)
    draws, bad = 4000, 0
    for _ in range(draws):
        members = [claims.judge("edge", [_heavy(rng) for _ in range(14)], above=0.0, alpha=claims.family(4))
                   for _ in range(4)]
        bad += claims.weakest(members).contradicted
    # as for one claim: a binomial(4000, 0.001) exceeds 12 with probability < 1e-3
    assert bad <= 12, f"{bad} of {draws} null families contradicted"


def test_this_run_counts_the_claims_checked_and_their_references(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(claims, "_CHECKED", {})
    assert "no timing claim yet" in claims.this_run()
    claims.check(claims.judge("a holds (per step)", [5.0 + i for i in range(12)], above=0))
    claims.check(claims.judge("a holds (per step)", [6.0 + i for i in range(12)], above=0))   # a cell run again
    assert claims.this_run().endswith(": 1 of 1 timing claims resolved")
    monkeypatch.setattr(references, "REFERENCES", _store(tmp_path))
    noise = [(-1) ** i * (i + 1.0) for i in range(12)]
    claims.check(claims.judge("the split shortens the tail (by 1 ms)", noise, below=0))
    assert claims.this_run().endswith("1 of 2 timing claims resolved; each unresolved one shows a reference run")
    claims.check(claims.judge("b shrinks", noise, below=0))
    assert claims.this_run().endswith("1 of 3 timing claims resolved; 1 of the 2 unresolved has no reference run yet")
    assert claims.this_run().startswith("this run (load ")


def test_a_tables_open_question_is_noted_recorded_and_gets_the_reference_answer(tmp_path, monkeypatch):
    monkeypatch.setattr(claims, "_CHECKED", {})
    monkeypatch.setattr(references, "REFERENCES", _store(tmp_path))
    out = tmp_path / "verdicts.jsonl"
    monkeypatch.setenv("DDPLAB_RECORD_CLAIMS", str(out))
    noise = [(-1) ** i * (i + 1.0) for i in range(12)]
    assert claims.noted(claims.judge("the split shortens the tail (by 1 ms)", noise, below=0)) == "yes, seen -4.1 ms (2026-12-03)"
    assert claims.noted(claims.judge("the split shortens the tail (by 1 ms)", [-5.0 - i for i in range(12)], below=0)) == ""
    assert claims.noted(claims.judge("b shrinks", noise, below=0)) == ""   # no reference stored
    assert claims.noted(claims.judge("b grows", [5.0 + i for i in range(12)], below=0)) == ""   # never raises
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["finding"] for r in rows] == [True] * 4 and rows[-1]["outcome"] == "contradicted"
    assert claims.this_run().endswith("2 of 3 timing claims resolved; 1 of the 1 unresolved has no reference run yet")


def test_working_says_nothing_outside_a_kernel_and_a_line_then_its_time_inside(monkeypatch, capsys):
    import ddplab.folded as folded

    with folded.working("reading 2 ranks' profiler traces"):
        pass
    assert capsys.readouterr().out == ""
    shown = []

    class Handle:
        def update(self, obj):
            shown.append(("update", obj.data))

    def display(obj, display_id=False):
        shown.append(("display", obj.data))
        return Handle()

    import IPython.display

    monkeypatch.setattr(folded, "_kernel", lambda: object())
    monkeypatch.setattr(IPython.display, "display", display)
    with folded.working("reading 2 ranks' profiler traces"):
        pass
    assert shown[0] == ("display", "reading 2 ranks' profiler traces...")
    assert shown[1][0] == "update" and shown[1][1].startswith("reading 2 ranks' profiler traces: ") and shown[1][1].endswith(" s")
