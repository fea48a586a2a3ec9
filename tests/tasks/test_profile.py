"""The profile probe: every rank's chrome trace and memory timeline, read back by the trace tables, by
Holistic Trace Analysis, and against the chapter-02 memory model; the readers on hand-written traces."""

from __future__ import annotations

import json
import types
import warnings

import matplotlib
import pytest
import torch

import ddplab
from ddplab import plots, tables
from ddplab.predict import memory as memory_model
from ddplab.tables import traces
from tests.support import share

matplotlib.use("Agg")

BASE_NS = 1_700_000_000_000_000_000


def X(name, ts, dur, tid=1, cat="user_annotation"):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}


def step_events(k: int, t: float, barrier: bool = True) -> list[dict]:
    """Step k at t µs: a barrier left at t + 10, forward, backward with one all-reduce launched on the
    main thread (the op nested in itself, as under a Python comm hook) and run on a gloo thread (tid 2),
    the optimizer."""
    return [X(f"ProfilerStep#{k}", t, 100),
            *([X("ddplab:barrier", t + 5, 5)] if barrier else []),
            X("ddplab:forward", t + 20, 10), X("ddplab:backward", t + 30, 20),
            X("c10d::allreduce_", t + 45, 2, cat="cpu_op"), X("c10d::allreduce_", t + 45.5, 1, cat="cpu_op"),  # nested
            X("gloo:all_reduce", t + 46, 10, tid=2),
            X("torch/distributed/distributed_c10d.py(2871): all_reduce", t + 44, 3, cat="python_function"),
            X("ddplab:optimizer", t + 60, 10), {"ph": "i", "name": "[memory]", "ts": t + 21, "tid": 1}]


def hand_trace(rank: int = 1, barrier_in_step_2: bool = True) -> dict:
    names = [{"ph": "M", "name": "thread_name", "pid": 1, "tid": tid, "args": {"name": f"thread {tid} ({name})"}}
             for tid, name in ((1, "python"), (2, "python"), (2, "pt_gloo_runloop"))]   # gloo renames its thread
    return {"distributedInfo": {"backend": "gloo", "rank": rank, "world_size": 2}, "baseTimeNanoseconds": BASE_NS,
            "traceEvents": names + step_events(1, 1000.0) + step_events(2, 2000.0, barrier=barrier_in_step_2)}


def test_events_are_in_ms_after_the_barrier_end_of_their_step():
    ev = traces.rank_events(hand_trace())
    assert set(ev["rank"]) == {1} and sorted(set(ev["step"])) == [1, 2]
    for step, rows in ev.groupby("step"):
        by_name = rows.set_index("name")
        assert by_name.loc["ddplab:barrier", "end_ms"] == 0
        assert by_name.loc["ddplab:forward", "start_ms"] == pytest.approx(0.010)
        assert by_name.loc["gloo:all_reduce", "dur_ms"] == pytest.approx(0.010)
        assert list(rows["kind"]) == ["barrier", "forward", "backward", "all_reduce", "all_reduce", "optimizer"]
        assert by_name.loc["c10d::allreduce_", "dur_ms"] == pytest.approx(0.002)   # the outer op only
    reduce = ev[ev["kind"] == "all_reduce"].set_index("name")
    assert reduce.loc["c10d::allreduce_", "main_thread"].all()
    assert not reduce.loc["gloo:all_reduce", "main_thread"].any()
    assert set(reduce.loc["c10d::allreduce_", "thread"]) == {"main"}
    assert set(reduce.loc["gloo:all_reduce", "thread"]) == {"pt_gloo_runloop 2"}
    assert not any("distributed_c10d.py" in n for n in ev["name"])   # not the Python frame around dist.all_reduce


def test_a_trace_without_the_barrier_label_is_refused_naming_the_step():
    with pytest.raises(ValueError, match=r"rank 1's trace has no 'ddplab:barrier' event in step\(s\) \[2\]"):
        traces.rank_events(hand_trace(barrier_in_step_2=False))


def test_a_trace_without_its_rank_or_steps_is_refused():
    no_rank = hand_trace()
    del no_rank["distributedInfo"]
    with pytest.raises(ValueError, match="distributedInfo"):
        traces.rank_events(no_rank)
    no_steps = hand_trace()
    no_steps["traceEvents"] = [e for e in no_steps["traceEvents"] if not e["name"].startswith("ProfilerStep")]
    with pytest.raises(ValueError, match="ProfilerStep#"):
        traces.rank_events(no_steps)


def test_memory_timeline_is_aligned_like_the_events_and_peaks_per_category():
    base_us = BASE_NS / 1e3   # the memory timeline's times are epoch µs
    timeline = {"categories": ["parameters", "optimizer_state", "activations", "gradients", "unknown"],
                "times_us": [base_us + 1010, base_us + 1025, base_us + 2040],
                "bytes": [[400, 0, 0, 0, 0], [400, 0, 96, 0, 8], [400, 0, 0, 400, 0]]}
    m = traces.rank_memory_timeline(timeline, hand_trace())
    assert list(m.columns) == ["rank", "step", "t_ms", "parameters", "gradients", "optimizer_state", "activations",
                               "unknown"]
    assert list(m["step"]) == [1, 1, 2]
    assert list(m["t_ms"]) == pytest.approx([0.0, 0.015, 0.030])
    peaks = traces.memory_timeline_peaks(m).loc[1]
    assert peaks[["parameters", "gradients", "activations", "unknown"]].tolist() == [400, 400, 96, 8]
    assert peaks["total"] == 800   # parameters and gradients at once, not the sum of the peaks
    with pytest.raises(ValueError, match="'bytes'"):
        traces.rank_memory_timeline({"categories": [], "times_us": []}, hand_trace())


def test_a_run_without_the_profile_probe_has_no_traces_to_read():
    run = types.SimpleNamespace(spec=ddplab.Experiment(name="plain"), ranks=[])
    with pytest.raises(ValueError, match=r"probes=\('profile',\)"):
        tables.traces.trace_events(run)


def straggler_trace(rank: int) -> dict:
    """Step 1 of a 2-rank straggler, in µs after 0: both ranks leave the barrier at 10 ms and run a 10 ms
    forward; rank 1 then pauses 45 ms before its backward, so rank 0's first all-reduce (on its gloo thread,
    from 36 ms) waits until rank 1 launches the same all-reduce at 80 ms."""
    ms = 1000.0
    late = rank == 1
    names = [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "thread 2 (python3)"}}]
    events = [X("ProfilerStep#1", 0, 100 * ms), X("ddplab:barrier", 5 * ms, 5 * ms),
              X("ddplab:forward", 20 * ms, 10 * ms),
              X("ddplab:backward", (75 if late else 30) * ms, (15 if late else 60) * ms),
              X("c10d::allreduce_", (80 if late else 35) * ms, 0.2 * ms, cat="cpu_op"),
              X("gloo:all_reduce", (81 if late else 36) * ms, (4 if late else 49) * ms, tid=2),
              X("ddplab:optimizer", 90 * ms, 5 * ms)]
    return {"distributedInfo": {"backend": "gloo", "rank": rank, "world_size": 2}, "baseTimeNanoseconds": BASE_NS,
            "traceEvents": names + events}


def straggler_run(tmp_path):
    """A stand-in run of `straggler_trace`'s two ranks, with rank 1 the straggler of its spec."""
    import json

    from ddplab.spec import Straggler

    for rank in (0, 1):
        (tmp_path / f"rank{rank}.json").write_text(json.dumps(straggler_trace(rank)))
    return types.SimpleNamespace(
        spec=types.SimpleNamespace(name="straggler", probes=("profile",), straggler=Straggler(rank=1, ms=45.0)),
        path=tmp_path, ranks=[types.SimpleNamespace(rank=r, result=types.SimpleNamespace(
            profile=types.SimpleNamespace(trace=f"rank{r}.json"))) for r in (0, 1)])


def test_the_timeline_names_gloo_workers_and_marks_the_pause_and_the_bucket_that_waits(tmp_path):
    run = straggler_run(tmp_path)
    ax = plots.traces.trace_timeline(run, step=1).axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 0\nmain thread", "rank 0\ngloo worker 1",
                                                            "rank 1\nmain thread", "rank 1\ngloo worker 1"]
    texts = [t.get_text() for t in ax.texts]
    assert "rank 1 pauses 45.0 ms (the straggler)" in texts, texts
    assert any("waits 44.0 ms for rank 1 to join" in t for t in texts), texts   # from 36 ms to rank 1's launch at 80
    run.spec.straggler = None   # the same trace without a straggler in the spec: no pause to mark
    assert not any("pauses" in t.get_text() for t in plots.traces.trace_timeline(run, step=1).axes[0].texts)


def test_the_waiting_buckets_note_is_drawn_whole_with_its_unit(tmp_path):
    """The note must lie inside the axes (a clipped note lost its unit: "waits 24."), and, where it is
    white on its bar, inside the bar."""
    run = straggler_run(tmp_path)
    fig = plots.traces.trace_timeline(run, step=1)
    fig.draw_without_rendering()
    ax = fig.axes[0]
    [note] = [t for t in ax.texts if "waits" in t.get_text()]
    assert " ".join(note.get_text().split()) == "first bucket: its all-reduce waits 44.0 ms for rank 1 to join (▼)"
    box, axes = note.get_window_extent(), ax.get_window_extent()
    assert axes.x0 <= box.x0 and box.x1 <= axes.x1, f"the note runs past the axes: {box} against {axes}"
    if note.get_color() == "white":   # inside rank 0's bar, from 36 ms to 85 ms
        bar = ax.transData.transform([(36, 0), (85, 0)])[:, 0]
        assert bar[0] <= box.x0 and box.x1 <= bar[1], f"the note runs past its bar: {box} against {bar}"


# ---- a real 2-rank run ----------------------------------------------------------------------------------
# 3 steps (step 0 is the profiler's warm-up), Adam as in chapter 02, buckets small enough for several
share("profile", lambda: [ddplab.Experiment(name="profile", world_size=2, local_batch=4, seq_len=8, steps=3,
                                            optimizer="adam", bucket_cap_mb=0.15, probes=("profile",))])


@pytest.fixture(scope="module")
def profiled(shared_runs):
    return shared_runs["profile"][0]


@pytest.fixture(scope="module")
def timelined(profiled, tmp_path_factory):
    """The profiled run if torch built every rank's memory timeline, else the same experiment launched
    again on its own (at most twice). torch's analyzer fails now and then on a trace (pytorch/pytorch#167838,
    seen once in a loaded CI run on rank 0): the lab says so (the tests below), but the tests of what the
    timeline holds need one from every rank, and a failure here is torch's, not the lab's."""
    run = profiled
    for attempt in range(2):
        if not (gaps := tables.traces.memory_gaps(run)):
            return run
        warnings.warn(f"torch's memory profiler failed on run {run.path.name}: {gaps}; launching it again")
        run = ddplab.run(profiled.spec, out=tmp_path_factory.mktemp(f"profile-again{attempt}"), progress=False)
    assert not (gaps := tables.traces.memory_gaps(run)), f"torch's memory profiler failed 3 runs in a row: {gaps}"
    return run


@pytest.mark.slow
def test_every_rank_wrote_its_trace_and_memory_timeline(profiled):
    for r in profiled.ranks:
        p = r.result.profile
        assert p.steps == [1, 2], "step 0 is the warm-up"
        assert (profiled.path / p.trace).stat().st_size > 0 and (profiled.path / p.memory_timeline).exists()
    assert sorted(f.name for f in tables.traces.trace_folder(profiled).iterdir()) == ["rank0.pt.trace.json",
                                                                              "rank1.pt.trace.json"]


@pytest.mark.slow
def test_traces_hold_the_lab_phases_and_every_bucket_all_reduce(profiled):
    ev = tables.traces.trace_events(profiled)
    counts = ev.groupby(["rank", "step", "kind", "name", "main_thread"]).size()
    print(counts.to_string())
    for rank in (0, 1):
        for step in (1, 2):
            c = counts.loc[(rank, step)]
            for kind in ("barrier", "forward", "backward", "optimizer"):
                assert c.loc[kind].sum() == 1, (rank, step, kind)
            launched = c.loc[("all_reduce", "c10d::allreduce_", True)]
            ran = c.loc[("all_reduce", "gloo:all_reduce", False)]
            assert launched == ran >= 2, f"rank {rank} step {step}: one all-reduce per bucket, launched and run"


@pytest.mark.slow
def test_barrier_ends_are_t0_on_every_rank_and_the_step_follows(profiled):
    ev = tables.traces.trace_events(profiled)
    barriers = ev[ev["kind"] == "barrier"]
    assert len(barriers) == 4 and (barriers["end_ms"] == 0).all()
    assert (ev[ev["kind"] != "barrier"].query("kind != 'all_reduce'")["start_ms"] > 0).all()


@pytest.mark.slow
def test_holistic_trace_analysis_reads_the_trace_folder_with_both_ranks(profiled):
    from hta.trace_analysis import TraceAnalysis

    analyzer = TraceAnalysis(trace_dir=str(tables.traces.trace_folder(profiled)))
    assert sorted(analyzer.t.get_ranks()) == [0, 1]


@pytest.mark.slow
def test_memory_timeline_holds_the_replicated_model_state_of_chapter_02(timelined):
    """Every rank holds the whole model: parameters, gradients and Adam's state, to the byte, as
    `predict.memory` says; DDP's flat buckets have no category of the profiler's own ("unknown"). The
    check holds for the profile probe alone: another probe's own tensors show in the timeline too."""
    m = tables.traces.memory_timeline(timelined)
    assert list(m.columns[3:7]) == ["parameters", "gradients", "optimizer_state", "activations"]
    assert {"inputs", "temporaries", "autograd_detail", "unknown"} <= set(m.columns)
    predicted = memory_model.state_bytes(timelined.spec)
    largest_tensor = max(memory_model.parameter_numels(timelined.spec)) * 4
    peaks = tables.traces.memory_timeline_peaks(m)
    for r in timelined.ranks:
        mine = m[m["rank"] == r.rank]
        settled = mine[mine["step"] == 2]   # step 1 allocates the buckets DDP rebuilt after step 0
        seen = {"parameters held": int(mine["parameters"].min()), "gradients at most": int(mine["gradients"].max()),
                "optimizer_state": int(mine["optimizer_state"].min()),
                "unknown held in step 2": int(settled["unknown"].min())}
        print(f"rank {r.rank}: {seen}; predicted {predicted}; model {r.model.parameter_bytes} B; "
              f"parameters peak {peaks.loc[r.rank, 'parameters']}")
        assert seen["parameters held"] == predicted["parameters"] == r.model.parameter_bytes
        assert seen["gradients at most"] == predicted["gradients"]
        assert seen["optimizer_state"] == mine["optimizer_state"].max() == predicted["optimizer_state"]
        # the buckets, and now and then a few bytes more the profiler could not attribute either (12 B seen)
        assert predicted["ddp_buckets"] <= seen["unknown held in step 2"] < predicted["ddp_buckets"] + 1024
        # Adam's per-tensor temporaries (the sqrt of exp_avg_sq) count as parameters while they live
        assert 0 < peaks.loc[r.rank, "parameters"] - predicted["parameters"] <= largest_tensor
        assert r.result.profile.peak_bytes == peaks.loc[r.rank].drop("total").to_dict()


@pytest.mark.slow
def test_the_merged_timeline_names_every_mark_it_draws(profiled, tmp_path):
    fig = plots.traces.trace_timeline(profiled)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    for mark in ("ddplab:barrier", "ddplab:forward", "ddplab:backward", "ddplab:optimizer", "c10d::allreduce_",
                 "gloo:all_reduce", "t = 0"):
        assert any(mark in label for label in labels), mark
    lanes = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    for rank in (0, 1):   # the main thread, then gloo's worker threads, which run two all-reduces at once
        mine = [lane.split("\n")[1] for lane in lanes if lane.startswith(f"rank {rank}\n")]
        assert mine[0] == "main thread" and mine[1] == "gloo worker 1", lanes
    fig.savefig(tmp_path / "trace_timeline.png")
    with pytest.raises(ValueError, match=r"step 0 was not profiled .* \[1, 2\]"):
        plots.traces.trace_timeline(profiled, step=0)


def test_a_memory_timeline_torch_cannot_build_is_said_not_raised():
    """torch's memory profiler fails on some traces (an AssertionError in its data-flow analysis,
    pytorch/pytorch#167838, seen here under load): the rank keeps its trace and says why the timeline is missing."""
    from ddplab.rank.probes import profile as probe

    class Failing:
        def export_memory_timeline(self, path, device):
            raise AssertionError("version mismatch: {...}")

    timeline = probe.memory_timeline(Failing(), torch.device("cpu"))
    assert timeline["bytes"] == [] and "pytorch/pytorch#167838" in timeline["unavailable"]
    assert "version mismatch" in timeline["unavailable"]


@pytest.mark.slow
def test_a_rank_without_a_memory_timeline_is_named_and_the_others_are_read(timelined, tmp_path):
    import shutil

    copy = tmp_path / timelined.path.name
    shutil.copytree(timelined.path, copy)
    gap = {"device": "cpu", "categories": [], "times_us": [], "bytes": [], "unavailable": "torch's memory profiler failed"}
    (copy / timelined.ranks[1].result.profile.memory_timeline).write_text(json.dumps(gap))
    run = ddplab.load_run(copy)
    table = tables.traces.memory_timeline(run)
    assert set(table["rank"]) == {0} and table.attrs["unavailable"] == {1: "torch's memory profiler failed"}
    assert tables.traces.memory_gap_reading(run).startswith("rank 1 has no memory timeline: torch's memory profiler failed")
    assert tables.traces.memory_gap_reading(timelined) == ""
    (copy / timelined.ranks[0].result.profile.memory_timeline).write_text(json.dumps(gap))
    with pytest.raises(ValueError, match="no rank has a memory timeline"):
        tables.traces.memory_timeline(ddplab.load_run(copy))
