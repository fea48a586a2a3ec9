"""The practice exercise's checker: correct evidence passes every check, and each classic
mistake is caught with its own message, against real 4-rank runs (the checker's own, hidden seed)."""

from __future__ import annotations

import copy

import pytest

import ddplab
from ddplab import Experiment, exercise
from ddplab.launch import session as sessions
from tests.exercise.test_evidence import notebook_templates, shows

pytestmark = pytest.mark.slow

EXP = Experiment(name="exercise-test", world_size=4, local_batch=4, accum_steps=2, steps=2, seq_len=8,
                 optimizer="adam", bucket_cap_mb=0.05)
CASE_BATCHES = [1, 2, 3, 4]


def _reference():
    """exercises/instructor/reference.py: the reference solution (not a package: loaded from its file)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "exercises" / "instructor" / "reference.py"
    spec = importlib.util.spec_from_file_location("exercise_reference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


reference = _reference()


@pytest.fixture(scope="module")
def reference_evidence(tmp_path_factory):
    out = tmp_path_factory.mktemp("exercise")
    mp = pytest.MonkeyPatch()
    mp.setenv("DDPLAB_RUNS", str(out / "runs"))   # the checker's own runs
    try:
        run, case = ddplab.run_many([exercise.evidence_run(EXP), exercise.check_case(EXP, CASE_BATCHES)], out / "mine",
                                    progress=False, warm=True)
        ev = reference.fill(EXP, run, case)
        yield ev, exercise.hidden_runs(ev, progress=False)
    finally:
        sessions.close_current()
        mp.undo()


def _messages(report, piece):
    return " | ".join(f.message for f in report.failures(piece))


def test_the_reference_evidence_passes_every_check(reference_evidence):
    ev, runs = reference_evidence
    report = exercise.judge(ev, runs)
    assert report.passed(), repr(report)
    assert len(report.findings) >= 15
    report.assert_passed()


def test_an_empty_template_is_all_todo_and_launches_nothing(monkeypatch):
    def no_launch(*args, **kwargs):
        raise AssertionError("an empty template launched ranks")

    monkeypatch.setattr(ddplab, "run_many", no_launch)
    report = exercise.check(exercise.template(EXP), progress=False)
    assert {f.ok for f in report.findings} == {None} and len(report.findings) == len(exercise.PIECES)
    with pytest.raises(exercise.EvidenceFailed, match="memory: not filled in yet"):
        report.assert_passed("memory")


@pytest.mark.parametrize("bad, field", [({"experiment": None}, "experiment"),
                                        ({"experiment": EXP.replace(steps=1)}, "experiment.steps"),
                                        ({"experiment": EXP.replace(loss_norm="global-sample")}, "experiment.loss_norm"),
                                        ({"experiment": EXP.replace(seq_len=(8, 8, 8, 4))}, "experiment.seq_len"),
                                        ({"experiment": EXP, "memroy": {}}, "memroy")])
def test_bad_evidence_structure_is_a_value_error_naming_the_field(bad, field):
    with pytest.raises(ValueError, match=field):
        exercise.check(bad, progress=False)


def _mutated(ev, piece, change):
    ev = copy.deepcopy({k: v for k, v in ev.items() if k != "experiment"})
    ev["experiment"] = EXP
    change(ev[piece])
    return ev


def _divide_memory(m):
    for row in m.values():
        row["optimizer_state"] //= 4


def _unweighted(g):
    g["global_batch_gradient"] = sum(g["local"]) / len(g["local"])


def _written(v) -> list[str]:
    """The ways a message could state `v`: a count or bytes with and without thousands commas, a time
    to two decimals, a gradient to nine significant digits."""
    return [f"{v:,.0f}", f"{v:.0f}"] if float(v) == int(v) else [f"{v:.2f}", f"{v:.9g}"]


MISTAKES = {   # mistake -> (piece, the change, words of its message, the right value the message must not state)
    "memory divided by the world size": ("memory", _divide_memory, "it divides none of them by the world size",
                                         lambda ev: ev["memory"][0]["optimizer_state"]),
    "unweighted mean of rank means with unequal batches": ("gradients", _unweighted, "unweighted mean",
                                                           lambda ev: ev["gradients"]["global_batch_gradient"]),
    "summed bucket durations reported as exposed time": (
        "buckets", lambda b: b.__setitem__("exposed_ms", b["summed_ms"]), "is the sum of the buckets' durations",
        lambda ev: ev["buckets"]["exposed_ms"]),
    "a payload that scales with the local batch": (
        "comm", lambda c: c.__setitem__("payload_bytes", c["payload_bytes"] * 4), "grows with the batch",
        lambda ev: ev["comm"]["payload_bytes"]),
    "global batch without the accumulation factor": (
        "batch", lambda b: b.__setitem__("global_batch", sum(b["local_batch"])), "counts every micro-step",
        lambda ev: ev["batch"]["global_batch"]),
    "bytes per rank without the ring factor 2(D-1)/D": (
        "comm", lambda c: c["bytes_per_rank"].__setitem__(4, c["payload_bytes"]), "leaves out the ring factor",
        lambda ev: ev["comm"]["bytes_per_rank"][4]),
}


@pytest.mark.parametrize("mistake", sorted(MISTAKES))
def test_each_classic_mistake_is_caught_with_its_own_message(reference_evidence, mistake):
    ev, runs = reference_evidence
    piece, change, words, right = MISTAKES[mistake]
    assert exercise.MISTAKES[mistake] == piece
    report = exercise.judge(_mutated(ev, piece, change), runs)
    said = _messages(report, piece)
    assert not report.passed(piece) and words in said, said
    assert not shows(said, *_written(right(ev))), said   # what is wrong and why, never the value to copy
    others = [p for p in exercise.PIECES if p != piece]
    assert report.passed(*others), repr(report)   # the mistake is pinned on its own piece


def test_the_notebooks_templates_filled_as_the_prose_reads_get_feedback_on_values(reference_evidence):
    """A first attempt: every `...` of the learner's templates replaced by a plausible misreading of its
    section. Each piece fails on its values, with the classic mistake's message, not on its keys."""
    ev, runs = reference_evidence
    run = runs["exercise-hidden"]
    first = notebook_templates(EXP)
    first["batch"].update(local_batch=EXP.local_batches, accum_steps=EXP.accum_steps,
                          global_batch=sum(EXP.local_batches))   # one micro-step's examples
    for r, row in first["memory"].items():
        row.update({c: round(v / 2 ** 20, 3) for c, v in ev["memory"][r].items()})   # the MiB table
    first["gradients"].update({k: ev["gradients"][k] for k in ("local_batch", "parameter", "element", "local")},
                              reduced=sum(ev["gradients"]["local"]),
                              global_batch_gradient=sum(ev["gradients"]["local"]) / EXP.world_size,
                              convention=lambda values, batches: sum(values) / len(values))
    first["readiness"]["ready_order"] = list(run.ranks[0].parameter_names)   # declaration order
    first["buckets"].update({k: ev["buckets"][k] for k in ("count", "trace", "last_ready_ms", "summed_ms")},
                            exposed_ms=ev["buckets"]["summed_ms"])
    first["comm"]["payload_bytes"] = ev["comm"]["payload_bytes"]
    first["comm"]["bytes_per_rank"] = {d: ev["comm"]["payload_bytes"] for d in first["comm"]["bytes_per_rank"]}
    report = exercise.judge(first, runs)
    assert all(f.ok is not None and f.check != "shape" for f in report.findings), repr(report)
    for piece, words in [("batch", "counts every micro-step"), ("memory", "looks like MiB"),
                         ("gradients", "unweighted mean"), ("readiness", "the order the parameters are declared in"),
                         ("buckets", "is the sum of the buckets' durations"), ("comm", "leaves out the ring factor")]:
        assert words in _messages(report, piece), (piece, repr(report))


def test_source_order_reported_as_ready_order_is_caught(reference_evidence):
    ev, runs = reference_evidence
    names = list(runs["exercise-hidden"].ranks[0].parameter_names)
    report = exercise.judge(_mutated(ev, "readiness", lambda r: r.__setitem__("ready_order", names)), runs)
    assert "the order the parameters are declared in" in _messages(report, "readiness")
    assert exercise.MISTAKES["source order reported as ready order"] == "readiness"


def test_a_convention_that_ignores_the_batches_fails_on_the_hidden_case(reference_evidence):
    ev, runs = reference_evidence
    report = exercise.judge(_mutated(ev, "gradients", lambda g: g.__setitem__("convention", lambda v, b: sum(v) / len(v))),
                         runs)
    assert "that is the unweighted mean" in _messages(report, "gradients"), repr(report)


def test_equal_check_case_batches_cannot_tell_the_conventions_apart(reference_evidence):
    ev, runs = reference_evidence
    report = exercise.judge(_mutated(ev, "gradients", lambda g: g.__setitem__("local_batch", [2, 2, 2, 2])), runs)
    assert "cannot tell the conventions apart" in _messages(report, "gradients")


def test_a_local_gradient_off_by_a_thousandth_does_not_pass(reference_evidence):
    ev, runs = reference_evidence
    report = exercise.judge(_mutated(ev, "gradients", lambda g: g["local"].__setitem__(1, g["local"][1] * 1.001)), runs)
    assert "rank 1's local gradient" in _messages(report, "gradients")


def test_correct_evidence_in_other_shapes_passes(reference_evidence):
    """A learner who writes a single local batch, string rank keys, numpy numbers or a list of rows."""
    import numpy as np

    ev, runs = reference_evidence
    ev = _mutated(ev, "batch", lambda b: b.__setitem__("local_batch", 4))
    ev["memory"] = {str(r): {k: np.int64(v) for k, v in row.items()} for r, row in ev["memory"].items()}
    ev["gradients"]["local"] = np.array(ev["gradients"]["local"], dtype=np.float64)
    ev["comm"]["bytes_per_rank"] = {str(d): v for d, v in ev["comm"]["bytes_per_rank"].items()}
    report = exercise.judge(ev, runs)
    assert report.passed(), repr(report)


def test_memory_written_in_mib_is_told_to_write_bytes(reference_evidence):
    ev, runs = reference_evidence

    def in_mib(m):
        for row in m.values():
            row["parameters"] = round(row["parameters"] / 2 ** 20, 3)

    report = exercise.judge(_mutated(ev, "memory", in_mib), runs)
    assert "looks like MiB" in _messages(report, "memory")


def test_an_invented_trace_with_other_bucket_sizes_does_not_pass(reference_evidence):
    ev, runs = reference_evidence

    def invented(b):
        b["trace"] = [{**t, "bytes": t["bytes"] + 4} for t in b["trace"]]

    report = exercise.judge(_mutated(ev, "buckets", invented), runs)
    said = _messages(report, "buckets")
    assert "DDP's buckets do not hold" in said and not shows(said, *_written(ev["buckets"]["trace"][0]["bytes"])), said


def test_malformed_evidence_is_a_finding_naming_the_field_not_a_traceback(reference_evidence):
    ev, runs = reference_evidence
    for piece, change, field in [("memory", lambda m: m.__setitem__("rank0", {}), "keys are rank numbers"),
                                 ("gradients", lambda g: g.__setitem__("local", 0.5), "gradients['local']"),
                                 ("comm", lambda c: c.__setitem__("payload_bytes", "lots"), "comm['payload_bytes']"),
                                 ("buckets", lambda b: b.__setitem__("trace", []), "buckets['trace']")]:
        report = exercise.judge(_mutated(ev, piece, change), runs)
        assert field in _messages(report, piece), (piece, repr(report))


def test_a_passing_row_never_shows_a_failing_rows_answer(reference_evidence):
    """The global-batch gradient's pass message names DDP's reduced value only when the learner's
    reduced value passed too: otherwise it would hand over another row's answer."""
    ev, runs = reference_evidence
    right = ev["gradients"]["reduced"]

    def every_row(report):   # passing rows too
        return " | ".join(f.message for f in report.findings if f.piece == "gradients")

    report = exercise.judge(_mutated(ev, "gradients", lambda g: g.__setitem__("reduced", 2 * right + 1.0)), runs)
    assert not report.passed("gradients") and not shows(every_row(report), *_written(right)), every_row(report)
    assert shows(every_row(exercise.judge(ev, runs)), *_written(right))   # shown once the learner has it right



def test_no_row_states_the_rule_another_row_asks_for(reference_evidence):
    """The convention row asks for the global-batch rule and the D > 2 rows for the ring factor: no row, passing
    or failing, states either (a learner who misses the factor still passes D = 2, whose row would have)."""
    ev, runs = reference_evidence
    no_factor = _mutated(ev, "comm", lambda c: c["bytes_per_rank"].__setitem__(4, c["payload_bytes"]))
    for report in (exercise.judge(ev, runs), exercise.judge(_mutated(ev, "gradients", _unweighted), runs),
                   exercise.judge(no_factor, runs)):
        said = " | ".join(f.message for f in report.findings)
        assert not any(rule in said for rule in ("b_r / B", "sum_r", "2(D-1)/D", "(D-1)/D")), said


def test_no_row_hands_over_another_rows_answer(reference_evidence):
    """Two neighbours that used to leak: the global-batch row, written as the unweighted mean while the reduced
    row is wrong, said that mean is DDP's reduced value; a passing gradients or Adam row stated bytes that
    are (twice) the parameters' while the parameters row was wrong."""
    ev, runs = reference_evidence

    def every_row(report, piece):
        return " | ".join(f.message for f in report.findings if f.piece == piece)

    def reduced_wrong_global_unweighted(g):
        g["reduced"] = 2 * g["reduced"] + 1.0
        _unweighted(g)
    report = exercise.judge(_mutated(ev, "gradients", reduced_wrong_global_unweighted), runs)
    said = every_row(report, "gradients")
    assert "must count more" in said and not shows(said, *_written(ev["gradients"]["reduced"])), said
    assert "b_r / B" not in said and "sum_r" not in said, said   # the convention row's rule, its answer
    assert "unweighted mean" not in said and "reduced value" not in said, said   # it would confirm the reduced answer

    def parameters_halved(m):
        for row in m.values():
            row["parameters"] //= 2
    report = exercise.judge(_mutated(ev, "memory", parameters_halved), runs)
    said = every_row(report, "memory")
    assert not report.passed("memory") and not shows(said, *_written(ev["memory"][0]["parameters"])), said
    assert not shows(said, *_written(ev["memory"][0]["gradients"]), *_written(ev["memory"][0]["optimizer_state"])), said
    assert shows(every_row(exercise.judge(ev, runs), "memory"), *_written(ev["memory"][0]["parameters"]))


def test_a_last_ready_time_taken_at_backwards_return_is_caught(reference_evidence):
    """Measured at backward()'s return, last_ready_ms falls after every bucket's done: the exposed tail
    would come out 0 and pass; the check that the last bucket launched after the last gradient fails."""
    ev, runs = reference_evidence

    def at_return(b):
        b["last_ready_ms"] = max(r["done_ms"] for r in b["trace"]) + 0.5
        b["exposed_ms"] = 0.0

    report = exercise.judge(_mutated(ev, "buckets", at_return), runs)
    assert not report.passed("buckets") and "not backward()'s return" in _messages(report, "buckets")


def test_a_passing_two_rank_row_does_not_show_the_payload_while_the_payload_row_fails(reference_evidence):
    """At D = 2 the ring sends the payload itself: a passing D = 2 row's byte count is the payload row's answer."""
    ev, runs = reference_evidence
    truth = ev["comm"]["payload_bytes"]

    def wrong_payload(c):
        c["payload_bytes"] = truth + 4096
        c["bytes_per_rank"][2] = truth   # right at D = 2, whatever the payload row says
    report = exercise.judge(_mutated(ev, "comm", wrong_payload), runs)
    said = _messages(report, "comm")
    assert not report.passed("comm") and not shows(said, *_written(truth)), said


def test_the_global_batch_row_confirms_nothing_of_the_rows_above_while_they_fail(reference_evidence):
    """A right global batch beside a wrong local-batch row must not spell out the local batches; an exposed
    tail written as the true summed durations beside a wrong summed row must not say it is that sum."""
    ev, runs = reference_evidence
    truth = list(ev["batch"]["local_batch"])

    def wrong_local(b):
        b["local_batch"] = [x + 1 for x in truth]
    said = _messages(exercise.judge(_mutated(ev, "batch", wrong_local), runs), "batch")
    assert " + ".join(map(str, truth)) not in said, said

    def summed_wrong_exposed_is_true_sum(b):
        b["exposed_ms"], b["summed_ms"] = b["summed_ms"], b["summed_ms"] * 3
    said = _messages(exercise.judge(_mutated(ev, "buckets", summed_wrong_exposed_is_true_sum), runs), "buckets")
    assert "is the sum of the buckets' durations" not in said, said
