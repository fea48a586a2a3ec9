"""What a cold launch says when something dies or stalls that is not a rank's own exception: torchrun itself killed, a
rank that ends itself with an exit code, a rank stopped while it still
imports torch, a session that died between cells, and a long torch.compile, which is progress, not a hang."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest

import ddplab
from ddplab import Experiment, RunFailed, processes, rundir
from ddplab.deaths import Deaths, agent_death, deaths_from, session_death
from ddplab.failures import diagnose
from ddplab.launch import session as sessions
from ddplab.launch.loopback import RANK_START_ENV
from ddplab.launch.watch import Watch
from ddplab.spec.tasks import COMMON_PHASES

from tests.support import leftovers
from tests.support.dying_task import Dying

PHASES = {p.name: p for p in (*COMMON_PHASES, *Dying.phases)}
REPORT_EXIT_7 = """[1]:
  time      : 2026-01-01_00:00:00
  host      : h
  rank      : 1 (local_rank: 1)
  exitcode  : 7 (pid: 42)
"""


def _rec(phase: str, **more) -> dict:
    return {"t_ns": 1, "phase": phase, "step": 0, "micro": 0, **more}


# ---- pure: the diagnosis from records ------------------------------------------------------------

def test_a_rank_that_exits_with_a_code_is_named_with_it_not_guessed_a_signal():
    dead = deaths_from(REPORT_EXIT_7)
    assert dead.exits == {1: 7}
    progress = {0: [_rec("dying all-reduce", collective="the dying task's all_reduce")], 1: [_rec("dying wait")]}
    lost = {"rank": 0, "t_ns": 2, "type": "DistBackendError", "message": "Connection closed by peer", "phase": "x",
            "step": 0, "traceback": ""}
    for errors in ({0: lost}, {}):   # rank 0 lost its peer, or torchrun stopped it first
        d = diagnose(progress, errors, set(), 2, 60, False, PHASES, deaths=dead)
        assert d.kind == "missing-result" and d.ranks == [1], d
        assert "Rank 1 exited with code 7 in 'dying wait'" in d.summary and "signal?" not in d.summary


def test_torchrun_killed_from_outside_is_said_and_no_rank_is_blamed_for_it():
    dead = Deaths(agent="torchrun, the launch's agent, was killed by SIGKILL")
    d = diagnose({0: [_rec("dying wait")], 1: [_rec("dying wait")]}, {}, set(), 2, 60, False, PHASES, deaths=dead)
    assert d.kind == "agent-died" and "was killed by SIGKILL mid-run" in d.summary and "No rank failed" in d.summary
    d = diagnose({}, {}, set(), 2, 60, False, PHASES, deaths=dead)
    assert "at start-up" in d.summary
    assert agent_death(-12, "").endswith("was killed by SIGUSR2")
    assert "received SIGTERM" in agent_death(143, "")   # caught: it stops its ranks, exits 128 + 15
    assert agent_death(1, "") == ""   # a rank failed: torchrun's own exit, no outside signal
    # a rank's own timeout came first (a hang): torchrun ending after it is a consequence (srun's SIGTERM to
    # the other nodes' agents), so the hang is said, naming the rank that never arrived
    timeout = {"rank": 0, "t_ns": 2, "type": "DistBackendError", "message": "Timed out waiting 3000ms for recv",
               "phase": "all-reduce", "step": 0, "traceback": "", "collective": "all_reduce"}
    progress = {0: [_rec("dying all-reduce", collective="the dying task's all_reduce")], 1: [_rec("dying wait")]}
    d = diagnose(progress, {0: timeout}, set(), 2, 3, False, PHASES, deaths=dead)
    assert d.kind != "agent-died" and d.ranks == [1], d


# torchrun's agent ended mid-run by each signal, as the launcher sees it (its exit status, its log): SIGKILL and
# SIGUSR2 it does not catch (it dies by them); SIGTERM it catches, stops its ranks and exits 128 + 15 (torch 2.13,
# saying nothing) or says "got signal"
@pytest.mark.parametrize("code, log, said", [
    (-signal.SIGKILL, "", "was killed by SIGKILL"),
    (128 + signal.SIGTERM, "", "received SIGTERM"),
    (1, "SignalException: Process 77 got signal: 15\n", "received SIGTERM"),
    (-signal.SIGUSR2, "", "was killed by SIGUSR2")])
def test_torchrun_ended_mid_run_by_a_signal_is_said_with_that_signal(code, log, said):
    dead = Deaths(agent=agent_death(code, log))
    progress = {0: [_rec("dying wait")], 1: [_rec("dying wait")]}
    d = diagnose(progress, {}, set(), 2, 60, False, PHASES, deaths=dead)
    assert d.kind == "agent-died" and d.ranks == [0, 1], d
    assert said in d.summary and "mid-run" in d.summary and "dying wait" in d.summary, d.summary


def test_a_rank_frozen_before_its_first_record_is_said_stopped_not_never_started():
    d = diagnose({0: [_rec("init-process-group", step=-1)]}, {}, set(), 2, 15, True, PHASES, frozen={1: "stopped"})
    assert d.ranks == [1] and "Rank 1 was stopped" in d.summary and "while still starting" in d.summary
    assert "never started" not in d.summary
    d = diagnose({}, {}, set(), 2, 15, True, PHASES, frozen={1: "stopped"})   # no rank recorded anything yet
    assert d.ranks == [1] and "Rank 1 was stopped" in d.summary


def test_ranks_still_compiling_when_the_bound_runs_out_are_not_a_hang_in_a_collective():
    progress = {r: [_rec("dying compile"), _rec("dying compile", compiling=True)] for r in (0, 1)}
    d = diagnose(progress, {}, set(), 2, 900, True, PHASES)
    assert d.kind == "compile-timeout" and "still compiling" in d.summary and "all_reduce" not in d.summary
    # one rank compiling while the other timed out waiting for it: the compiling rank never arrived, and says why
    progress[0] = [_rec("dying all-reduce", collective="the dying task's all_reduce")]
    timeout = {"rank": 0, "t_ns": 2, "type": "DistBackendError", "message": "timed out", "phase": "x", "step": 0,
               "traceback": ""}
    d = diagnose(progress, {0: timeout}, set(), 2, 5, False, PHASES)
    assert d.kind == "hang" and d.ranks == [1] and "still compiling" in d.summary


def test_a_compile_mark_gives_the_watch_compiles_own_bound(tmp_path, monkeypatch):
    monkeypatch.setenv("DDPLAB_COMPILE_LIMIT_S", "300")
    exp = Experiment(name="c", world_size=1, task=Dying(), timeout_s=2)
    watch = Watch([(exp, tmp_path)])
    path = rundir.progress_file(tmp_path, 0)
    path.write_text(json.dumps(_rec("dying compile")) + "\n")
    watch.poll()
    assert watch.limit_s(120) == 12
    with open(path, "a") as f:
        f.write(json.dumps(_rec("dying compile", compiling=True)) + "\n")
    watch.poll()
    assert watch.limit_s(120) == 300 and "(compiling" in watch.line(1.0)
    with open(path, "a") as f:
        f.write(json.dumps(_rec("dying compile", compiling=False)) + "\n")
    watch.poll()
    assert watch.limit_s(120) == 12
    monkeypatch.setenv("DDPLAB_COMPILE_LIMIT_S", "soon")
    with pytest.raises(ValueError, match="DDPLAB_COMPILE_LIMIT_S"):
        Watch([(exp, tmp_path)])


def test_a_session_that_died_names_the_rank_the_signal_or_its_deleted_directory():
    log = REPORT_EXIT_7.replace("exitcode  : 7", "exitcode  : -9")
    assert session_death(1, log) == "rank 1 was killed by SIGKILL, so torchrun stopped the session (exit code 1)"
    caught = "SignalException: Process 77 got signal: 15\n"
    assert "received SIGTERM" in session_death(1, caught)
    assert "received SIGTERM" in session_death(143, "")   # torch 2.13's agent exits 128 + 15, saying nothing
    assert "its directory /s was deleted" in session_death(0, "", Path("/s"))
    # the launcher's process is the keeper above torchrun: no pid is said as torchrun's
    assert session_death(-9, "") == "torchrun, the session's launcher, was killed by SIGKILL, and its ranks went with it"
    assert "pid" not in session_death(143, "")


# ---- real launches ---------------------------------------------------------------------------------

def _agent_of(where: Path, within_s: float = 120):
    """torchrun's agent of the launch writing under `where`, as soon as it exists (not the keeper above
    it, whose command line carries the agent's after its own `--`)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        for p in psutil.process_iter(["cmdline"]):
            args = p.info["cmdline"] or []
            own = args[: args.index("--")] if "--" in args else args
            if "ddplab.launch.loopback" in own and str(where) in " ".join(args) \
                    and processes.rank_of_name(p) is None:   # not a rank forked from it (its command line)
                return p
        time.sleep(0.02)
    raise AssertionError(f"no torchrun agent under {where} within {within_s} s")


def _progress_has(where: Path, rank: int, phase: str, within_s: float = 120) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        for f in where.glob(f".*.partial/rank{rank}.progress"):
            if f'"{phase}"' in f.read_text():
                return
        time.sleep(0.05)
    raise AssertionError(f"rank {rank} never reached {phase!r}")


def _in_background(fn) -> list:
    """Run `fn` on a thread; what it raised, if anything, is appended to the list returned."""
    raised: list = []

    def body():
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            raised.append(e)

    threading.Thread(target=body, daemon=True).start()
    return raised


# one real launch for each way torchrun's agent ends: SIGTERM it catches (it stops its ranks itself), SIGUSR2 it
# does not (it dies by it, as by SIGKILL, which no process can catch, and the keeper above it must die by it too);
# SIGKILL's own name mid-run is test_torchrun_ended_mid_run_by_a_signal_is_said_with_that_signal's, and a real
# SIGKILL is sent to torchrun at start-up and to a session's mid-job
@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR2])
def test_torchrun_killed_mid_run_is_said_with_its_signal(tmp_path, sig):
    out = tmp_path / "run"
    exp = Experiment(name="agent", world_size=2, task=Dying(wait_s=120), timeout_s=200)

    def kill_agent():
        agent = _agent_of(tmp_path)
        for r in (0, 1):
            _progress_has(tmp_path, r, "dying wait")
        agent.send_signal(sig)

    raised = _in_background(kill_agent)
    t0 = time.monotonic()
    with pytest.raises(RunFailed) as e:
        ddplab.run(exp, out, progress=False, warm=False)
    assert not raised, raised
    d = e.value.diagnosis
    assert d.kind == "agent-died" and d.ranks == [0, 1], d
    said = "received SIGTERM" if sig == signal.SIGTERM else "was killed by SIGUSR2"
    assert said in d.summary and "mid-run" in d.summary and "dying wait" in d.summary, d.summary
    assert time.monotonic() - t0 < 100   # said when torchrun died, not when the ranks' 120 s wait would end
    assert leftovers(out) == []


@pytest.mark.slow
def test_torchrun_killed_at_start_up_is_said(tmp_path):
    out = tmp_path / "run"
    exp = Experiment(name="agent", world_size=2, task=Dying(), timeout_s=30)
    raised = _in_background(lambda: _agent_of(tmp_path).kill())
    with pytest.raises(RunFailed) as e:
        ddplab.run(exp, out, progress=False, warm=False)
    assert not raised, raised
    d = e.value.diagnosis
    assert d.kind == "agent-died" and "was killed by SIGKILL at start-up" in d.summary, d.summary
    assert leftovers(out) == []


@pytest.mark.slow
def test_a_rank_that_exits_with_code_7_is_reported_with_code_7(tmp_path):
    exp = Experiment(name="exit7", world_size=2, task=Dying(exit_rank=1, exit_code=7), timeout_s=30)
    with pytest.raises(RunFailed) as e:
        ddplab.run(exp, tmp_path / "run", progress=False, warm=False)
    d = e.value.diagnosis
    assert d.ranks == [1] and "Rank 1 exited with code 7 in 'dying wait'" in d.summary, d.summary
    assert "signal" not in d.summary.split("See launch.log")[0].replace("not a signal", ""), d.summary


def _to_rank_1_before_its_first_record(tmp_path, recorded, act) -> None:
    """Find rank 1 under the torchrun agent of the launch in `tmp_path` and do `act(process)` to it while
    `recorded()` is still False (it still imports torch: the launch must exec its ranks, `exec_ranks`)."""
    agent = _agent_of(tmp_path)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for p in agent.children(recursive=True):
            try:
                if p.environ().get("RANK") == "1" and not recorded():
                    act(p)
                    return
            except psutil.Error:
                pass
        time.sleep(0.005)
    raise AssertionError("rank 1 never appeared")


@pytest.fixture
def exec_ranks(monkeypatch):
    """Ranks started as new interpreters, as torchrun starts a script (and as on a GPU machine): a rank
    forked from the agent has torch imported already, so there is no import to catch it in."""
    monkeypatch.setenv(RANK_START_ENV, "exec")


@pytest.mark.slow
def test_a_rank_stopped_while_importing_is_said_stopped(tmp_path, exec_ranks):
    out = tmp_path / "run"
    exp = Experiment(name="stopped", world_size=2, task=Dying(), timeout_s=3)

    def stop_rank_1():   # SIGSTOP, while it still imports torch
        _to_rank_1_before_its_first_record(tmp_path, lambda: rundir.progress_file(out, 1).exists(),
                                           lambda p: p.suspend())

    raised = _in_background(stop_rank_1)
    with pytest.raises(RunFailed) as e:
        ddplab.run(exp, out, progress=False, warm=False, startup_timeout_s=60)
    assert not raised, raised
    d = e.value.diagnosis
    assert d.kind == "hang" and d.ranks == [1] and "Rank 1 was stopped" in d.summary, d.summary
    assert "never started" not in d.summary and not list(Path(e.value.run_dir).glob("rank1.progress"))
    assert leftovers(out) == []


@pytest.mark.slow
def test_a_compile_longer_than_the_stall_limit_is_progress_not_a_hang(tmp_path):
    lines: list[str] = []
    # nothing else may stand still for timeout_s + 10 s = 11 s; the backend compiles for 16 s
    exp = Experiment(name="compiles", world_size=1, task=Dying(compile_s=16), timeout_s=1)
    run = ddplab.run(exp, tmp_path / "run", progress=lines.append, warm=False)
    assert run.ranks[0].result.rank_sum == 3.0
    marks = [r.get("compiling") for r in rundir.read_progress(run.path, 0) if "compiling" in r]
    assert marks == [True, False]
    assert any("still compiling" in line for line in lines), lines


@pytest.mark.slow
def test_a_compile_past_its_own_bound_is_said_still_compiling(tmp_path, monkeypatch):
    monkeypatch.setenv("DDPLAB_COMPILE_LIMIT_S", "3")
    exp = Experiment(name="compiles", world_size=1, task=Dying(compile_s=300), timeout_s=1)
    t0 = time.monotonic()
    with pytest.raises(RunFailed) as e:
        ddplab.run(exp, tmp_path / "run", progress=False, warm=False)
    d = e.value.diagnosis
    assert d.kind == "compile-timeout" and "Rank 0 were still compiling" not in d.summary
    assert "still compiling (torch.compile) in 'dying compile'" in d.summary, d.summary
    assert time.monotonic() - t0 < 200   # the bound, not the 300 s compile
    assert leftovers(tmp_path / "run") == []


@pytest.mark.slow
def test_a_session_killed_between_cells_says_which_rank_and_how(tmp_path):
    s = ddplab.Session(world_size=2, runs_dir=tmp_path / "runs")
    try:
        pid = rundir.read_progress(s.dir, 1)[-1]["pid"]
        os.kill(pid, signal.SIGKILL)
        s.proc.wait(timeout=60)
        why = sessions.last_end()
        assert why is not None and "rank 1 was killed by SIGKILL" in why, why
    finally:
        s.close()


@pytest.mark.slow
def test_a_session_whose_directory_was_deleted_between_cells_says_so(tmp_path):
    s = ddplab.Session(world_size=1, runs_dir=tmp_path / "runs")
    try:
        shutil.rmtree(s.dir)
        s.proc.wait(timeout=60)
        why = sessions.last_end()
        assert why is not None and f"its directory {s.dir} was deleted" in why, why
    finally:
        s.close()


@pytest.mark.slow
def test_a_warm_jobs_torchrun_killed_mid_job_is_said_with_its_signal(tmp_path):
    s = ddplab.Session(world_size=2, runs_dir=tmp_path / "runs")
    try:
        out = tmp_path / "run"
        exp = Experiment(name="agent", world_size=2, task=Dying(wait_s=120), timeout_s=200)

        def kill_agent():
            agent = _agent_of(tmp_path)
            for r in (0, 1):
                _progress_has(tmp_path, r, "dying wait")
            agent.kill()

        raised = _in_background(kill_agent)
        t0 = time.monotonic()
        with pytest.raises(RunFailed) as e:
            ddplab.run(exp, out, progress=False)
        assert not raised, raised
        d = e.value.diagnosis
        assert d.kind == "agent-died" and d.ranks == [0, 1], d
        assert "was killed by SIGKILL" in d.summary and "dying wait" in d.summary, d.summary
        assert time.monotonic() - t0 < 100   # said when torchrun died, not when the ranks' 120 s wait would end
        why = sessions.last_end()
        assert why is not None and "torchrun, the session's launcher, was killed by SIGKILL" in why, why
        assert leftovers(out) == []
    finally:
        s.close()


def _start_session_doing(tmp_path, to_rank_1, startup_timeout_s: float = 120):
    """Start a 2-rank session while `to_rank_1(process)` is done to rank 1 as soon as it runs, before its
    first record (it still imports torch: `exec_ranks`); the RunFailed the start raised."""
    runs = tmp_path / "runs"

    def act():
        _to_rank_1_before_its_first_record(tmp_path, lambda: bool(list(runs.glob(".sessions/*/rank1.progress"))),
                                           to_rank_1)

    raised = _in_background(act)
    with pytest.raises(RunFailed) as e:
        ddplab.Session(world_size=2, runs_dir=runs, startup_timeout_s=startup_timeout_s)
    assert not raised, raised
    return e.value


@pytest.mark.slow
def test_a_rank_killed_while_a_session_starts_is_named_with_its_signal(tmp_path, exec_ranks):
    d = _start_session_doing(tmp_path, psutil.Process.kill).diagnosis
    assert "could not start" in d.summary and d.ranks == [1], d
    assert "Rank 1 was killed by SIGKILL" in d.summary, d.summary


@pytest.mark.slow
def test_a_rank_stopped_while_a_session_starts_is_said_stopped(tmp_path, exec_ranks):
    d = _start_session_doing(tmp_path, psutil.Process.suspend, startup_timeout_s=20).diagnosis
    assert d.kind == "hang" and d.ranks == [1] and "Rank 1 was stopped" in d.summary, d.summary
