"""Real torchrun runs on gloo: results per rank, failures diagnosed, no process left behind."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import ddplab
from ddplab import Experiment, RunFailed, launch, recipes, record, rundir
from ddplab.launch.cold import run_dir_for
from ddplab.launch import watch
from ddplab.spec import Fault

from tests.support import RUN2, ctrl_c_reaches_it, launch_leftovers, leftovers, share

pytestmark = pytest.mark.slow

share("t2-none", lambda: [RUN2.replace(name="t2-none", sync="none")])   # run2 without synchronization, shared


def check_shards(run):
    ids = [i for r in run.ranks for i in r.sample_ids]
    total = run.spec.global_batch * run.spec.steps
    assert len(ids) == len(set(ids)) == total, "shards overlap or miss examples"
    assert sorted(ids) == list(range(total))


@pytest.mark.parametrize("fixture", ["run2", "run4"])
def test_every_rank_is_its_own_process_with_identical_parameters(fixture, request):
    run = request.getfixturevalue(fixture)
    w = run.spec.world_size
    assert [r.rank for r in run.ranks] == list(range(w))
    assert len({r.pid for r in run.ranks}) == w
    assert all(r.world_size == w and r.backend == "gloo" and r.device == "cpu" for r in run.ranks)
    assert len({r.param_checksum.built for r in run.ranks}) == 1
    assert len({r.param_checksum.initial for r in run.ranks}) == 1
    assert len({r.param_checksum.final for r in run.ranks}) == 1
    assert run.ranks[0].param_checksum.final != run.ranks[0].param_checksum.initial
    check_shards(run)
    assert not launch_leftovers(run)


@pytest.mark.parametrize("fixture", ["run2", "run4"])
def test_ddp_update_equals_the_single_process_global_batch_update(fixture, request):
    for r in request.getfixturevalue(fixture).ranks:
        assert r.reference.ddp.update_rel_error < 1e-5
        assert r.reference.independent.update_rel_error > 1e-2


def test_independent_updates_differ_from_rank_to_rank(run4):
    assert len({r.reference.independent.param_checksum for r in run4.ranks}) == 4
    assert run4.spec.global_batch == 64 and run4.spec.local_batches == [16] * 4


def test_sync_none_rank_takes_exactly_the_independent_update(run2, shared_runs):
    alone = shared_runs["t2-none"][0]
    assert alone.spec == run2.spec.replace(name="t2-none", sync="none")   # the same run, unsynchronized
    for r_ddp, r_alone in zip(run2.ranks, alone.ranks):
        assert r_alone.steps[0].param_checksum == r_ddp.reference.independent.param_checksum
    assert len({r.param_checksum.final for r in alone.ranks}) == 2


def test_load_run_reloads_the_same_results(run2):
    again = ddplab.load_run(run2.path)
    assert again.spec == run2.spec and again.ranks == run2.ranks
    assert [record.dump(record.RankRecord(r.envelope, r.result)) for r in again.ranks] == \
        [json.loads(rundir.rank_file(run2.path, r.rank).read_text()) for r in run2.ranks]
    assert again.launch["returncode"] == 0 and again.launch["argv"][-1].endswith("spec.json")


def edit(f, section, **changes):
    """Rewrite one section (envelope or result) of a rank file with `changes`."""
    d = json.loads(f.read_text())
    d[section] = {**d[section], **changes}
    f.write_text(json.dumps(d))


@pytest.mark.parametrize("damage,match", [
    (lambda f: f.unlink(), "Rank 1 wrote no result"),
    (lambda f: f.write_text('{"rank": 1, "world_'), "Rank 1's result file is not valid JSON"),
    (lambda f: edit(f, "envelope", spec_hash="0000000000"), "belongs to spec 0000000000"),
    (lambda f: edit(f, "result", steps=[]), "has 0 steps"),
    (lambda f: edit(f, "envelope", launch_id="another"), "another launch"),
    (lambda f: edit(f, "envelope", rank=0), "claims rank 0 of 2, expected rank 1 of 2"),
    (lambda f: f.write_text(json.dumps({**json.loads(f.read_text()), "schema_version": 1})), "schema version 1"),
    (lambda f: edit(f, "result", model={"parameter_count": "many", "parameter_bytes": 4}),
     "result.model.parameter_count: expected int"),
    (lambda f: f.with_name("rank1.error.json").write_text("{}"), "failed after writing it"),
])
def test_missing_or_corrupt_rank_file_is_a_failed_run(run2, tmp_path, damage, match):
    copy = tmp_path / "copy"
    shutil.copytree(run2.path, copy)
    damage(rundir.rank_file(copy, 1))
    with pytest.raises(RunFailed, match=match) as info:
        ddplab.load_run(copy)
    assert info.value.diagnosis.ranks == [1]


def test_the_watchdog_grace_is_ten_seconds():
    assert watch.STALL_GRACE_S == 10.0   # the tests below shorten it, to wait less for the same behaviour


def test_keyboard_interrupt_kills_the_whole_process_tree(tmp_path):
    run_dir = tmp_path / "interrupted"
    script = textwrap.dedent(f"""
        import ddplab
        from ddplab.spec import Fault
        ddplab.run(ddplab.Experiment(world_size=2, steps=2, fault=Fault("stall", step=1), timeout_s=300),
                   {str(run_dir)!r}, progress=False)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True,
                            preexec_fn=ctrl_c_reaches_it)
    deadline = time.monotonic() + 120
    while not any(r and r[-1]["phase"] == "forward" and r[-1]["step"] == 1
                  for staged in run_dir.parent.glob(f".{run_dir.name}.*.partial")   # a launch writes there first
                  for r in (rundir.read_progress(staged, k) for k in range(2))):
        assert time.monotonic() < deadline and proc.poll() is None, "the run never got going"
        time.sleep(0.2)
    assert leftovers(run_dir), "expected live ranks before the interrupt"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    # a KeyboardInterrupt that says what it stopped (a notebook shows just this line)
    assert proc.returncode != 0 and "Interrupted: interrupted: 2 ranks stopped after" in err, err
    time.sleep(0.5)
    assert not leftovers(run_dir)


def test_user_model_factory_runs_on_every_rank_and_the_launch_says_it_is_starting_before_the_first_rank_reports(
        tmp_path, monkeypatch):
    from ddplab.launch import cold
    from ddplab.launch.progress import Reporter

    made = []

    class Recording(Reporter):
        def __init__(self, enabled=True):
            super().__init__(enabled)
            made.append(self)

    monkeypatch.setattr(cold, "Reporter", Recording)
    (tmp_path / "lab_user_nets.py").write_text(textwrap.dedent("""
        import torch.nn as nn
        def bigram(vocab_size):
            return nn.Sequential(nn.Embedding(vocab_size, 16), nn.Linear(16, vocab_size))
    """))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    run = ddplab.run(Experiment(name="starting", model="lab_user_nets:bigram", world_size=2), tmp_path / "run")
    assert run.ranks[0].model.parameter_count == 64 * 16 + 16 * 64 + 64
    assert len({r.param_checksum.final for r in run.ranks}) == 1
    first = made[0].history[0]
    assert first.startswith("ddplab starting: starting 2 ranks (starting) on gloo/cpu"), made[0].history


def cli(*args, timeout=180):
    return subprocess.run([sys.executable, "-m", "ddplab.cli", *args], capture_output=True, text=True, timeout=timeout)


def test_cli_run_prints_a_per_rank_table(tmp_path):
    out = cli("run", "--world-size", "2", "--local-batch", "3,5", "--steps", "2", "--out", str(tmp_path / "c"))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split()[:3] == ["pid", "backend", "device"]
    assert "global batch 8 = sum of local batches [3, 5] x accum_steps 1" in out.stdout


def test_cli_refuses_bad_input_without_launching(tmp_path):
    out = cli("run", "--world-size", "4", "--local-batch", "16,16,16", "--out", str(tmp_path / "bad"))
    assert out.returncode == 2 and "local_batch: has 3 entries but world_size is 4" in out.stderr
    assert not (tmp_path / "bad").exists()


def test_cli_run_reports_a_failure_and_exits_nonzero(tmp_path):
    # one rank: what is checked is the CLI's report and exit code; naming the rank that crashed among
    # several is the run_many test's crash below
    out = cli("run", "--world-size", "1", "--fault", "crash", "--fault-rank", "0", "--out", str(tmp_path / "f"))
    assert out.returncode == 1 and "Rank 0 failed" in out.stderr and "Traceback" in out.stderr


def test_doctor_runs_a_two_rank_all_reduce():
    out = cli("doctor")
    assert out.returncode == 0, out.stdout
    assert "expected on every rank: 3.0" in out.stdout
    assert "rank 0: 3.0" in out.stdout and "rank 1: 3.0" in out.stdout
    import torch

    assert f"torch {torch.__version__}: " in out.stdout   # the release, and whether the lab was verified on it


def test_run_many_runs_each_experiment_on_its_own_ranks_and_stops_at_a_crash_named_by_rank_with_its_traceback(tmp_path):
    ok = [Experiment(name="one", world_size=1, local_batch=6), Experiment(name="two", world_size=2, local_batch=3)]
    bad = recipes.crash(world_size=2, fault_rank=1)   # rank 1 raises in step 1; rank 0 loses its peer
    with pytest.raises(RunFailed, match="Rank 1 failed in 'forward' of step 1") as info:
        launch.run_many([*ok, bad], tmp_path / "sweep", progress=False)
    d = info.value.diagnosis
    assert d.kind == "crash" and d.ranks == [1]
    assert "Traceback" in str(info.value) and "injected fault: rank 1 crashed" in str(info.value)
    assert info.value.run_dir == run_dir_for(bad, tmp_path / "sweep")
    one, two = (ddplab.load_run(run_dir_for(e, tmp_path / "sweep")) for e in ok)
    assert [r.sample_ids for r in one.ranks] == [list(range(6))]
    assert [r.sample_ids for r in two.ranks] == [[0, 1, 2], [3, 4, 5]]
    assert one.launch["argv"] == two.launch["argv"], "one launch for all experiments"
    assert not leftovers(tmp_path / "sweep")


def test_a_rank_outside_a_long_narrow_experiment_waits_for_it_beyond_the_collective_timeout(tmp_path):
    # the 2-rank run lasts over 12 s, half as long again as the 8 s a collective may wait: rank 2 must not
    # wait for the 3-rank run inside a collective (notebook 09 under load: rank 2 timed out, torchrun
    # stopped ranks 0 and 1 mid-step). Without the gate: "Rank 2 waited in the broadcast ..."
    from ddplab.spec import Straggler
    long = Experiment(name="long-narrow", world_size=2, steps=4, timeout_s=8.0,
                      straggler=Straggler(1, "data", 3000))
    wide = Experiment(name="wide-after", world_size=3, steps=2, timeout_s=8.0)
    t0 = time.monotonic()
    narrow_run, wide_run = launch.run_many([long, wide], tmp_path / "gate", progress=False)
    assert time.monotonic() - t0 > 12.0, "the narrow run was meant to outlast the timeout"
    assert [r.rank for r in narrow_run.ranks] == [0, 1] and [r.rank for r in wide_run.ranks] == [0, 1, 2]
    assert not leftovers(tmp_path / "gate")


def test_a_stalled_rank_is_stopped_by_the_launcher_watchdog_and_without_synchronization_is_the_one_blamed(
        runs_dir, monkeypatch):
    # only the watchdog ends it (rank 0 finishes, rank 1 sleeps); 4 s leave the ranks' start-up skew room
    monkeypatch.setattr(watch, "STALL_GRACE_S", 4.0)
    STALL_GRACE_S = watch.STALL_GRACE_S
    exp = Experiment(name="stall-alone", world_size=2, steps=2, sync="none", fault=Fault("stall", rank=1, step=1),
                     timeout_s=2)
    said = []
    with pytest.raises(RunFailed, match="ddplab stopped the run") as info:
        ddplab.run(exp, runs_dir / "stall-alone", progress=said.append)
    stopped_at_ns = time.time_ns()
    d = info.value.diagnosis
    assert d.kind == "hang" and d.ranks == [1], str(d)
    assert "Rank 1 never arrived: its last phase was 'forward' of step 1" in d.summary
    # the watchdog asked the ranks before it stopped them: rank 1's stack says where it was
    assert "inject_fault" in d.stacks[1] and "time.sleep" in d.stacks[1], d.stacks
    # the last line says where the seconds went: the limit the hang ran out, and the rest before it
    last = re.search(r"FAILED after ([0-9.]+) s \(hang, rank 1; ([0-9.]+) s of it the launcher's watchdog limit, "
                     r"the other ([0-9.]+) s everything else: the start, the steps before the hang and the teardown "
                     r"after it\)", said[-1])
    assert last and float(last[2]) == exp.timeout_s + STALL_GRACE_S, said[-1]
    assert abs(float(last[2]) + float(last[3]) - float(last[1])) <= 0.11, said[-1]
    # the wait it reports is the one the watchdog allowed, not the collective's timeout alone
    assert f"nothing moved for {exp.timeout_s + STALL_GRACE_S:g} s" in d.summary
    # counted from the last record of any rank: rank 0 moves on after rank 1 stalls
    moved_at_ns = max(rundir.read_progress(runs_dir / "stall-alone", r)[-1]["t_ns"] for r in range(2))
    latency_s = (stopped_at_ns - moved_at_ns) / 1e9
    assert exp.timeout_s + STALL_GRACE_S <= latency_s < exp.timeout_s + STALL_GRACE_S + 10
    assert json.loads((runs_dir / "stall-alone" / rundir.LAUNCH).read_text())["stopped_by_watchdog"]
    assert not leftovers(runs_dir / "stall-alone")


def test_a_sigstopped_rank_is_named_as_stopped_not_all_ranks_together(tmp_path):
    """A rank frozen by SIGSTOP (Ctrl-Z, a debugger) is the one blamed, even when it froze inside the
    collective the others wait in: the launcher sees its process state."""
    import psutil

    run_dir = tmp_path / "frozen"
    script = textwrap.dedent(f"""
        import ddplab
        import ddplab.launch.watch
        ddplab.launch.watch.STALL_GRACE_S = 2.0   # the watchdog ends it sooner; the frozen-process check names rank 1
        exp = ddplab.Experiment(world_size=2, steps=10_000, local_batch=8, timeout_s=4)
        try:
            ddplab.run(exp, {str(run_dir)!r}, progress=False)
        except ddplab.RunFailed as e:
            print("KIND", e.diagnosis.kind, e.diagnosis.ranks)
            print(e.diagnosis.summary)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    pid = None
    while pid is None:
        assert time.monotonic() < deadline and proc.poll() is None, "the run never got going"
        time.sleep(0.2)
        for staged in run_dir.parent.glob(f".{run_dir.name}.*.partial"):
            rec = rundir.read_progress(staged, 1)
            if rec and rec[-1]["step"] >= 2:
                pid = rec[-1]["pid"]
    psutil.Process(pid).suspend()   # SIGSTOP, wherever rank 1 is in its step
    out, _ = proc.communicate(timeout=90)
    assert "KIND hang [1]" in out, out
    assert "Rank 1 was stopped" in out and "All ranks stopped together" not in out, out
    assert not leftovers(run_dir)
