"""Notebook 09, pipeline parallelism: the Pipeline spec refuses bad settings before launch; the bubble
formula and the schedule simulator agree where they must; the tables and checks read hand-made
timelines right (and fail on wrong ones); and real 2- and 4-stage gloo runs of torch's GPipe and
1F1B give the unsplit model's loss and gradients, run torch's order of work, and hold the
activations the schedule predicts."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ddplab import verify
from ddplab.predict import pipeline as model
from ddplab.recipes.pipeline import pipeline_parallel
from ddplab.spec import Experiment, Pipeline
from ddplab.spec.pipeline import PipelineRecord, PipelineStep, StageOp, UnsplitCheck
from ddplab.tables import pipeline as views

SIZES = dict(d_model=32, n_layers=4, n_heads=2, seq_len=8)


# ---- the spec ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("settings, exp_fields, field", [
    (dict(schedules=("PipeDream",)), {}, "task.schedules"),
    (dict(schedules=()), {}, "task.schedules"),
    (dict(schedules=("GPipe", "GPipe")), {}, "task.schedules"),
    (dict(microbatches=(0, 2)), {}, "task.microbatches"),
    (dict(microbatches=(2, 2)), {}, "task.microbatches"),
    (dict(schedules=("1F1B",), microbatches=(1, 4)), {}, "task.microbatches"),   # torch refuses m < p for 1F1B
    (dict(rounds=0), {}, "task.rounds"),
    (dict(global_batch=30, microbatches=(4,)), {}, "task.global_batch"),
    (dict(global_batch=0), {}, "task.global_batch"),
    ({}, dict(world_size=3), "n_layers"),                                          # 4 blocks on 3 stages
    ({}, dict(world_size=1), "world_size"),
    ({}, dict(model="mlp"), "model"),
    ({}, dict(tie_weights=True), "tie_weights"),
    ({}, dict(seq_len=(8, 8)), "seq_len"),
])
def test_bad_pipeline_settings_are_refused_naming_the_field(settings, exp_fields, field):
    with pytest.raises(ValueError, match=f"Experiment.{field}:"):
        Experiment(**{**SIZES, "world_size": 2, **exp_fields}, task=Pipeline(**settings))


def test_a_field_the_pipeline_task_does_not_read_is_refused():
    with pytest.raises(ValueError, match="Experiment.local_batch: the pipeline task does not read it"):
        Experiment(**SIZES, world_size=2, local_batch=4, task=Pipeline())


def test_pipeline_spec_round_trips_and_lists_what_torch_refuses():
    exp = Experiment(**SIZES, world_size=4, task=Pipeline(microbatches=(1, 4, 8), rounds=2, global_batch=16))
    again = Experiment.from_json(exp.to_json())
    assert again == exp and again.hash == exp.hash and again.task.total_steps(again) == 2
    assert exp.task.combos(exp) == [("GPipe", 1), ("GPipe", 4), ("GPipe", 8), ("1F1B", 4), ("1F1B", 8)]
    assert exp.task.not_run(exp) == [("1F1B", 1)]


def test_the_recipe_is_a_2_stage_and_a_4_stage_experiment_for_one_launch():
    two, four = pipeline_parallel()
    assert (two.name, two.world_size, four.name, four.world_size) == ("pipeline-2-stages", 2, "pipeline-4-stages", 4)
    assert two.task.microbatches == (1, 2, 4, 8) and set(two.task.schedules) == {"GPipe", "1F1B"}
    assert two.n_layers % 4 == 0


# ---- the pure model ------------------------------------------------------------------------------------
ALL = [(s, p, m) for s in model.SCHEDULES for p in (2, 3, 4) for m in (1, 2, 3, 4, 8) if model.runs(s, p, m)]


@pytest.mark.parametrize("schedule, p, m", ALL)
def test_equal_durations_give_the_formula_exactly_on_every_stage(schedule, p, m):
    sim = model.simulate(schedule, [3] * p, [5] * p, m)
    assert sim.stage_bubble == [model.bubble_fraction(p, m)] * p
    assert sim.bubble == pytest.approx(model.bubble_fraction(p, m), abs=1e-15)
    assert sim.span_ms == (m + p - 1) * 8


@pytest.mark.parametrize("schedule, p, m", ALL)
def test_microbatches_in_flight_are_gpipes_m_and_1f1bs_min_m_p_minus_stage(schedule, p, m):
    sim = model.simulate(schedule, [1] * p, [2] * p, m)
    for stage, ops in enumerate(sim.timelines):
        held, most = 0, 0
        for op in ops:
            held += 1 if op.kind == "F" else -1
            most = max(most, held)
        assert most == model.in_flight(schedule, p, m, stage) == (m if schedule == "GPipe" else min(m, p - stage))
        assert sorted((op.kind, op.microbatch) for op in ops) == sorted([("F", i) for i in range(m)] +
                                                                       [("B", i) for i in range(m)])


def test_1f1b_order_is_torchs_warm_up_then_one_backward_one_forward():
    assert model.order("1F1B", 2, 4, 0) == [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("F", 3), ("B", 2),
                                             ("B", 3)]
    assert model.order("1F1B", 2, 4, 1) == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2), ("F", 3),
                                             ("B", 3)]
    assert model.order("GPipe", 2, 2, 1) == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]


def test_a_slower_stage_widens_the_bubble_as_worked_out_by_hand():
    # stage 0: F0 0-1, F1 1-2, B0 9-11, B1 13-15; stage 1: F0 1-3, F1 3-5, B0 5-9, B1 9-13; span 15
    sim = model.simulate("GPipe", [1, 2], [2, 4], 2)
    assert [(op.kind, op.start_ms, op.end_ms) for op in sim.timelines[0]] == [("F", 0, 1), ("F", 1, 2), ("B", 9, 11),
                                                                            ("B", 13, 15)]
    assert sim.span_ms == 15 and sim.stage_bubble == [9 / 15, 3 / 15] and sim.bubble == pytest.approx(0.4)
    assert model.simulate("GPipe", [1, 1], [2, 2], 2, send_ms=0.5).span_ms == 3 * 3 + 2 * 0.5


def test_the_simulator_takes_one_duration_per_microbatch():
    even = model.simulate("1F1B", [1, 1], [2, 2], 4)
    assert model.simulate("1F1B", [[1] * 4, 1], [2, (2, 2, 2, 2)], 4) == even
    slow_first = model.simulate("1F1B", [[5, 1, 1, 1], [1, 1, 1, 1]], [2, 2], 4)
    assert slow_first.timelines[1][0].start_ms == 5


@pytest.mark.parametrize("call", [
    lambda: model.simulate("1F1B", [1, 1, 1, 1], [2, 2, 2, 2], 2),      # torch's Schedule1F1B needs m >= p
    lambda: model.simulate("GPipe", [1, 1], [2], 2),
    lambda: model.simulate("GPipe", [1, -1], [2, 2], 2),
    lambda: model.simulate("GPipe", [[1, 1, 1], 1], [2, 2], 2),
    lambda: model.simulate("Zero-bubble", [1, 1], [2, 2], 2),
    lambda: model.bubble_fraction(2, 0),
    lambda: model.in_flight("GPipe", 2, 4, 2),
])
def test_the_pure_model_refuses_bad_input(call):
    with pytest.raises(ValueError):
        call()


# ---- the tables and checks on hand-made timelines ---------------------------------------------------------
BYTES_PER_MICROBATCH = 1000


def fake_run(p: int, forward_ms, backward_ms, send_ms: float = 0.0, microbatches=(2, 4), rounds: int = 2,
             schedules=("GPipe", "1F1B"), in_flight_bug: bool = False, grad_error: float = 1e-8, name="fake"):
    """A run-shaped object whose stages recorded the steps the simulator replays (with `send_ms` of
    waiting on every hop), saving BYTES_PER_MICROBATCH per microbatch in flight."""
    exp = Experiment(**SIZES, name=name, world_size=p, task=Pipeline(schedules=schedules, microbatches=microbatches,
                                                                     rounds=rounds, global_batch=16))
    per_stage = [[] for _ in range(p)]
    checks = [[] for _ in range(p)]
    for schedule, m in exp.task.combos(exp):
        for r in range(-1, rounds):
            sim = model.simulate(schedule, forward_ms, backward_ms, m, send_ms=send_ms)
            base = 10 ** 9 * (r + 2)
            for stage, ops in enumerate(sim.timelines):
                held, recorded = 0, []
                for op in ops:
                    held += 1 if op.kind == "F" else -1
                    start, end = base + round(op.start_ms * 1e6), base + round(op.end_ms * 1e6)
                    recorded.append(StageOp("forward" if op.kind == "F" else "backward", op.microbatch, start, end,
                                            held, held * BYTES_PER_MICROBATCH, cpu_ns=end - start))
                most = max(o.in_flight for o in recorded) + (1 if in_flight_bug and schedule == "1F1B" else 0)
                per_stage[stage].append(PipelineStep(schedule, m, r, base, recorded, most * BYTES_PER_MICROBATCH, most))
                if r == -1:
                    checks[stage].append(UnsplitCheck(schedule, m, 4.2 if stage == p - 1 else None, 4.2,
                                                      grad_error, 1.0))
    ranks = [SimpleNamespace(rank=s, result=PipelineRecord(s, p, [s], [f"blocks.{s}.w"], 4, 16, checks[s],
                                                           per_stage[s])) for s in range(p)]
    return SimpleNamespace(spec=exp, ranks=ranks, world_size=p)


EVEN = fake_run(2, [2, 2], [4, 4], name="even")


def test_bubble_table_puts_the_measurement_beside_the_formula_and_the_replay():
    t = views.bubble(EVEN)
    row = t.loc[("GPipe", 2, 4)]
    assert row["rounds"] == 2 and row["measured"] == pytest.approx(0.2) and row["formula"] == pytest.approx(0.2)
    assert row["simulated"] == pytest.approx(0.2) and row["waits"] == pytest.approx(0, abs=1e-9)
    assert row["verdict"] == "matches" and row["span_ms"] == pytest.approx(5 * 6)
    assert views.bubble(fake_run(4, [1] * 4, [2] * 4, microbatches=(2, 4))).loc[("1F1B", 4, 2), "verdict"] == "not run"


def test_waiting_for_sends_shows_as_waits_and_cannot_be_resolved(capsys):
    slow_sends = fake_run(2, [2, 2], [4, 4], send_ms=3.0, name="slow-sends")
    t = views.bubble(slow_sends)
    assert (t["waits"] > 0.05).all() and t["simulated"].tolist() == pytest.approx(t["formula"].tolist())
    assert t["formula_low"].tolist() == pytest.approx(t["formula"].tolist())   # equal stages: no leeway
    views.verify_bubble_matches_formula(slow_sends)
    out = capsys.readouterr().out
    assert "cannot resolve on this machine: GPipe p=2 m=4" in out and "waited for messages for 2" in out
    assert "the waits explain the gap" in out
    # nothing resolved: no "verified" line, but no failure either (the machine, not the formula)
    assert "verified: the measured bubble" not in out and "cannot verify on this machine" in out


@pytest.mark.parametrize("wrong, why", [
    (lambda p, m: p / (m + p), "the stages idled less than the formula says"),         # above the measurement
    (lambda p, m: (p - 1) / (m + p - 1) / 2, "the waits do not explain the gap"),       # below, unexcused
])
def test_waits_excuse_only_a_formula_the_compute_replay_gives(monkeypatch, wrong, why):
    # the sends inflate every measured bubble (waits); a wrong formula on either side still fails
    slow_sends = fake_run(2, [2, 2], [4, 4], send_ms=1.0, microbatches=(2, 4, 8), name="slow-sends")
    views.verify_bubble_matches_formula(slow_sends)
    monkeypatch.setattr(views, "bubble_fraction", wrong)
    with pytest.raises(verify.CheckFailed, match=why):
        views.verify_bubble_matches_formula(slow_sends)


def test_a_formula_above_the_measured_range_is_not_excused_by_waits(monkeypatch):
    slow_sends = fake_run(2, [2, 2], [4, 4], send_ms=3.0, microbatches=(4,), schedules=("GPipe",))
    row = views.bubble(slow_sends).loc[("GPipe", 2, 4)]
    monkeypatch.setattr(views, "bubble_fraction", lambda p, m: row["measured_max"] + 0.05)
    assert views.bubble(slow_sends).loc[("GPipe", 2, 4), "verdict"] == "does not match"


def test_matching_at_one_microbatch_alone_is_no_evidence(monkeypatch, capsys):
    slow_sends = fake_run(2, [2, 2], [4, 4], send_ms=3.0, microbatches=(1, 2), schedules=("GPipe",))
    at_m1 = views.bubble(slow_sends).loc[("GPipe", 2, 1), "measured"]
    formula = views.bubble_fraction    # a formula that happens to hit the measurement at m = 1 only
    monkeypatch.setattr(views, "bubble_fraction", lambda p, m: at_m1 if m == 1 else formula(p, m))
    t = views.bubble(slow_sends)
    assert t.loc[("GPipe", 2, 1), "verdict"] == "matches" and t.loc[("GPipe", 2, 2), "verdict"] == "cannot resolve"
    views.verify_bubble_matches_formula(slow_sends)
    out = capsys.readouterr().out
    assert "verified:" not in out and "only m = 1 matched (GPipe p=2 m=1)" in out


def test_the_formula_range_brackets_the_formula_for_any_stage_durations():
    import random

    rng = random.Random(0)
    for _ in range(2000):
        p, m = rng.choice([2, 3, 4, 6]), rng.choice([1, 2, 3, 4, 8, 12])
        schedule = rng.choice(model.SCHEDULES)
        if not model.runs(schedule, p, m):
            continue
        f, b = [rng.uniform(0.3, 3) for _ in range(p)], [rng.uniform(0.3, 6) for _ in range(p)]
        low, high = model.formula_range(model.simulate(schedule, f, b, m).bubble, f, b)
        assert low - 1e-12 <= model.bubble_fraction(p, m) <= high + 1e-12
    assert model.formula_range(0.2, [2, 2], [4, 4]) == pytest.approx((0.2, 0.2))
    with pytest.raises(ValueError):
        model.formula_range(0.2, [2, 2], [4])


def test_verify_bubble_fails_for_unequal_stages_without_waits(capsys):
    views.verify_bubble_matches_formula(EVEN)
    assert "4 pairs with m >= 2 match (" in capsys.readouterr().out
    lopsided = fake_run(2, [1, 3], [2, 6], name="lopsided")      # stage 1 three times slower, no waits
    with pytest.raises(verify.CheckFailed, match=r"NOT verified: the measured bubble matches .* 1F1B p=2 m=2: measured 0.429"):
        views.verify_bubble_matches_formula(lopsided)
    views.verify_bubble_matches_formula(lopsided, tolerance=0.3)   # a stated tolerance wide enough passes


def test_timeline_table_starts_at_the_first_forward():
    t = views.timeline(EVEN, "1F1B", 4, round_=1)
    assert t["start_ms"].min() == 0 and len(t) == 2 * 2 * 4 and set(t["kind"]) == {"forward", "backward"}
    assert t[t["stage"] == 1]["start_ms"].min() == pytest.approx(2.0)
    with pytest.raises(ValueError, match="no step"):
        views.timeline(EVEN, "1F1B", 8)


def test_verify_activation_memory_holds_for_the_schedule_and_fails_for_an_extra_microbatch(capsys):
    t = views.activation_memory(EVEN)
    assert t.loc[("GPipe", 2, 4, 0), "in_flight"] == 4 and t.loc[("1F1B", 2, 4, 0), "in_flight"] == 2
    assert t.loc[("1F1B", 2, 4, 1), "predicted_peak_mib"] == pytest.approx(BYTES_PER_MICROBATCH / 2 ** 20)
    views.verify_activation_memory(EVEN)
    assert "verified: each stage holds" in capsys.readouterr().out
    with pytest.raises(verify.CheckFailed, match=r"1F1B p=2 m=2 stage 0: 3 in flight"):
        views.verify_activation_memory(fake_run(2, [2, 2], [4, 4], in_flight_bug=True))


def test_verify_pipeline_matches_unsplit_fails_for_a_wrong_gradient(capsys):
    views.verify_pipeline_matches_unsplit(EVEN)
    assert capsys.readouterr().out.count("verified:") == 2
    with pytest.raises(verify.CheckFailed, match="gradient is the unsplit model's"):
        views.verify_pipeline_matches_unsplit(fake_run(2, [2, 2], [4, 4], grad_error=1e-3))


def test_timeline_figure_has_one_panel_per_schedule():
    import matplotlib

    matplotlib.use("Agg")
    from ddplab.plots import pipeline as plots

    fig = plots.timeline(EVEN, 4, detached=True)
    assert [ax.get_title("left").split(",")[0] for ax in fig.axes] == ["GPipe", "1F1B"]
    assert "formula (p-1)/(m+p-1) = 0.20" in fig.axes[0].get_title("left")
    assert len(plots.timeline(EVEN, 2, schedules=["1F1B"], detached=True).axes) == 1
    assert plots.bubble_vs_microbatches([EVEN], detached=True).axes
    assert [ax.get_title("left") for ax in plots.activation_memory([EVEN], detached=True).axes] == \
        ["2 stages: peak saved activations per stage"]


# ---- the stage pieces, in this process ------------------------------------------------------------------
def test_the_stages_chained_are_the_unsplit_model_and_own_each_parameter_once():
    import torch

    from ddplab.rank import data, models
    from ddplab.rank.parallel.pipeline import TransformerStage

    exp = Experiment(**SIZES, world_size=4, task=Pipeline())
    full = models.build(exp)
    x, _ = data.batch(0, list(range(4)), 8, exp.vocab_size)
    stages = [TransformerStage(full, s, 4) for s in range(4)]
    h = x
    for stage in stages:
        h = stage(h)
    assert torch.equal(h, full(x))
    names = [n for s in stages for n, _ in s.named_parameters()]
    assert sorted(names) == sorted(n for n, _ in full.named_parameters())


def test_live_saved_bytes_counts_what_autograd_holds_until_backward():
    import torch

    from ddplab.rank.parallel.pipeline import LiveSavedBytes

    w = torch.randn(64, 64, requires_grad=True)
    meter = LiveSavedBytes([w])
    with meter:
        a = torch.randn(8, 64, requires_grad=True)
        y1 = (a @ w).relu().sum()       # saves a (w is a parameter: not counted) and relu's output
        one = meter.bytes
        y2 = (a @ w).relu().sum()       # a again (counted once), another relu output
        assert one == 2 * 8 * 64 * 4 and meter.bytes == 3 * 8 * 64 * 4 and meter.peak_bytes == meter.bytes
        y1.backward()
        assert meter.bytes == 2 * 8 * 64 * 4
        y2.backward()
    assert meter.bytes == 0 and meter.peak_bytes == 3 * 8 * 64 * 4


def test_live_saved_bytes_leaves_out_token_ids_that_views_of_one_batch_share():
    import torch

    from ddplab.rank.parallel.pipeline import LiveSavedBytes

    emb = torch.nn.Embedding(16, 8)
    ids = torch.randint(0, 16, (4, 32))          # the global batch; the microbatches are views of it
    meter = LiveSavedBytes(emb.parameters())
    with meter:
        outs = [emb(mb).relu().sum() for mb in ids.chunk(4)]
        # each microbatch: relu's output, 32 tokens x 8 float32 = 1024 bytes; the ids the embedding saves
        # (one storage, the global batch's) are not activations and would charge 1024 bytes to the first
        assert meter.bytes == meter.peak_bytes == 4 * 32 * 8 * 4
        for out in outs:
            out.backward()
    assert meter.bytes == 0


# ---- real runs: one 4-rank launch of a 2-stage and a 4-stage pipeline --------------------------------------
@pytest.fixture(scope="module")
def pipeline_runs(chapter09_runs):
    """The recipe, small: GPipe and 1F1B at m = 1, 2, 4 on 2 and on 4 stages, 2 rounds (launched with the
    rest of chapter 09, conftest's `chapter09_runs`)."""
    return [chapter09_runs["pipeline-2-stages"], chapter09_runs["pipeline-4-stages"]]


@pytest.mark.slow
def test_pipeline_loss_and_gradients_equal_the_unsplit_model(pipeline_runs, capsys):
    views.verify_pipeline_matches_unsplit(pipeline_runs)
    assert capsys.readouterr().out.count("verified:") == 2
    for run in pipeline_runs:
        combos = run.spec.task.combos(run.spec)
        for r in run.ranks:
            assert [(c.schedule, c.microbatches) for c in r.result.checks] == combos
            assert (r.result.checks[0].loss is None) == (r.rank < run.world_size - 1)
        names = [n for r in run.ranks for n in r.result.parameter_names]
        assert len(names) == len(set(names)) and "tok_emb.weight" in run.ranks[0].result.parameter_names
        assert "head.weight" in run.ranks[-1].result.parameter_names


@pytest.mark.slow
def test_every_stage_runs_torchs_order_of_work(pipeline_runs):
    for run in pipeline_runs:
        for (schedule, m, _), stage_steps in views.steps(run).items():
            for stage, step in enumerate(stage_steps):
                ran = [(op.kind[0].upper(), op.microbatch) for op in step.ops if op.kind != "loss"]
                assert ran == model.order(schedule, run.world_size, m, stage), (schedule, m, stage)
                losses = [op.microbatch for op in step.ops if op.kind == "loss"]
                assert losses == (list(range(m)) if stage == run.world_size - 1 else [])


@pytest.mark.slow
def test_each_stage_holds_the_activations_the_schedule_predicts(pipeline_runs, capsys):
    views.verify_activation_memory(pipeline_runs)
    assert "verified: each stage holds" in capsys.readouterr().out
    t = views.activation_memory(pipeline_runs)
    gpipe = t.loc[("GPipe", 2)].groupby("stage")["peak_mib"]
    assert (gpipe.max() / gpipe.min() < 1.02).all()           # one global batch: GPipe's peak whatever m
    assert t.loc[("1F1B", 2, 4, 0), "peak_mib"] < 0.6 * t.loc[("GPipe", 2, 4, 0), "peak_mib"]


@pytest.mark.slow
def test_measured_bubble_matches_the_formula_or_says_why(pipeline_runs, capsys):
    views.verify_bubble_matches_formula(pipeline_runs)     # a correct formula never fails, however noisy
    out = capsys.readouterr().out
    assert "verified: the measured bubble matches" in out or "cannot verify on this machine" in out \
        or "cannot resolve here now: the measured bubble" in out
    t = views.bubble(pipeline_runs)
    ran = t[t["verdict"] != "not run"]
    assert set(ran["verdict"]) <= {"matches", "cannot resolve"} and (ran["rounds"] == 2).all()
    assert (ran["measured"] > ran["formula"] - views.BUBBLE_TOLERANCE).all()   # no stage idles less than the schedule lets it
    assert (ran["compute"] == "cpu").all() and (ran["cores"] >= 1).all()
    assert t.loc[("1F1B", 4, 1), "verdict"] == "not run"


@pytest.mark.slow
@pytest.mark.parametrize("wrong", [lambda p, m: p / (m + p), lambda p, m: (p - 1) / (m + p - 1) / 2],
                         ids=["p/(m+p)", "half"])
def test_the_bubble_check_fails_a_wrong_formula_on_the_real_runs(pipeline_runs, monkeypatch, wrong):
    monkeypatch.setattr(views, "bubble_fraction", wrong)
    with pytest.raises(verify.CheckFailed, match="NOT verified: the measured bubble matches"):
        views.verify_bubble_matches_formula(pipeline_runs)
