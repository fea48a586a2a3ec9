"""A session of warm ranks: the same results as a cold launch, failures diagnosed the
same way, and no rank outliving the session, its launcher or a failed job."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import ddplab
from ddplab import Experiment, RunFailed, rundir
from ddplab.launch import session as sessions
from ddplab.predict.memory import CATEGORIES
from ddplab.spec import Fault

from tests.support import ctrl_c_reaches_it, leftovers

pytestmark = pytest.mark.slow

SMALL = dict(world_size=2, steps=2, local_batch=4, seq_len=8)
ONE = {**SMALL, "world_size": 1}   # where no claim needs a second rank: a rank start is most of a launch's cost


def _wait_gone(path, within_s: float) -> list[str]:
    deadline = time.monotonic() + within_s
    while leftovers(path) and time.monotonic() < deadline:
        time.sleep(0.1)
    return leftovers(path)


def _same(a, b) -> bool:
    import torch

    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


@pytest.fixture(scope="module")
def _warm_sessions(tmp_path_factory):
    """Where the tests that take `warm` keep the 2-rank session they share while it lives."""
    held = {"session": None, "runs": tmp_path_factory.mktemp("warm") / "runs"}
    yield held
    _close_held(held)


def _close_held(held) -> None:
    s, held["session"] = held["session"], None
    if s is not None:
        s.close()
        assert _wait_gone(s.dir, 5) == []


@pytest.fixture(autouse=True)
def _only_warm_tests_see_the_shared_session(request, _warm_sessions):
    """A test that does not take `warm` starts with no session open (it may expect `run` to start one)."""
    if "warm" not in request.fixturenames:
        _close_held(_warm_sessions)


@pytest.fixture
def warm(_warm_sessions):
    """A live, current session of 2 warm ranks: the one an earlier test left healthy, else a new one.
    Starting its ranks is most of what a test costs, and no claim here needs a fresh session: the tests
    whose job fails tear it down (and check that nothing of it is left), and the next gets a new one."""
    s = _warm_sessions["session"]
    if s is None or sessions.current() is not s or not s.fits([Experiment(**SMALL)], s.backend, s.device):
        _close_held(_warm_sessions)
        s = _warm_sessions["session"] = ddplab.Session(world_size=2, runs_dir=_warm_sessions["runs"])
    yield s
    if not s.alive():
        _warm_sessions["session"] = None
        s.close()
        assert _wait_gone(s.dir, 5) == []


def test_a_warm_run_is_bit_identical_to_a_cold_one(tmp_path, warm):
    exp = Experiment(name="same", probes=("gradients", "memory", "reference"), **SMALL)
    w = ddplab.run(exp, tmp_path / "warm", progress=False)
    assert w.launch["session"] == warm.dir.name and sessions.current() is warm
    # the same spec again as the session's next job: nothing of the job before leaked into it
    again = ddplab.run(exp, tmp_path / "again", progress=False)
    assert again.launch["session"] == warm.dir.name
    c = ddplab.run(exp, tmp_path / "cold", progress=False, warm=False)   # cold, the session aside
    assert c.launch["session"] is None and warm.alive()
    ledger = lambda r: [({ph: {c: v[c] for c in CATEGORIES} for ph, v in st.phases.items()}, st.peak)
                        for st in r.memory.steps]   # the ledger, not the process's RSS
    for warm_run in (w, again):
        for rw, rc in zip(warm_run.ranks, c.ranks):
            assert rw.param_checksum == rc.param_checksum
            assert [s.loss for s in rw.steps] == [s.loss for s in rc.steps]
            assert ledger(rw) == ledger(rc)
            assert _same(warm_run.tensors(rw.rank), c.tensors(rc.rank))   # every saved gradient, bit for bit


def test_a_session_runs_smaller_experiments_and_sweeps_as_one_launch_would(tmp_path, warm):
    # a smaller experiment on 1 of the session's 2 ranks, then a sweep of a smaller and a full-width one as
    # one job (a narrower job of 2 ranks in a 4-rank session: tests/tasks/test_compression.py's
    # test_a_narrower_jobs_own_groups_leave_the_next_jobs_groups_meeting)
    jobs = warm.jobs
    one = ddplab.run(Experiment(name="one", **ONE), tmp_path / "one", progress=False)
    runs = ddplab.run_many([Experiment(name="a", **ONE), Experiment(name="b", **SMALL)],
                           tmp_path / "many", progress=False)
    assert len(one.ranks) == 1 and [len(r.ranks) for r in runs] == [1, 2]
    assert one.launch["session"] == warm.dir.name and {r.launch["session"] for r in runs} == {warm.dir.name}
    assert warm.jobs == jobs + 2 and warm.alive()


def _fails_as_cold_and_tears_the_session_down(tmp_path, warm, fault, kind) -> Experiment:
    """The failed job's diagnosis, as a cold launch's, and no session left to run in; its experiment."""
    exp = Experiment(name="bad", fault=fault, timeout_s=3, **SMALL)
    t0 = time.monotonic()
    with pytest.raises(RunFailed) as info:
        ddplab.run(exp, tmp_path / "bad", progress=False)
    assert time.monotonic() - t0 < exp.timeout_s + 15
    d = info.value.diagnosis
    assert d.kind == kind and d.ranks == [1], str(d)
    if kind == "crash":
        assert "injected fault" in d.tracebacks[1]
    else:
        assert "never arrived" in d.summary
    assert not warm.alive() and sessions.current() is None
    assert _wait_gone(warm.dir, 5) == []
    return exp


def test_a_crashed_job_is_diagnosed_as_cold_tears_the_session_down_and_the_next_run_starts_a_fresh_one(
        tmp_path, monkeypatch, warm):
    bad = _fails_as_cold_and_tears_the_session_down(tmp_path, warm, Fault("crash", rank=1, step=1), "crash")
    monkeypatch.setenv("DDPLAB_RUNS", str(tmp_path / "runs"))
    try:
        ok = ddplab.run(bad.replace(fault=None), tmp_path / "ok", progress=False, warm=True)
        assert ok.launch["session"] == sessions.current().dir.name != warm.dir.name
    finally:
        sessions.close_current()
    assert _wait_gone(tmp_path / "runs", 5) == []


def test_a_hung_job_is_diagnosed_as_cold_and_tears_the_session_down(tmp_path, warm):
    _fails_as_cold_and_tears_the_session_down(tmp_path, warm, Fault("skip-backward", rank=1, step=1), "hang")


def test_ctrl_c_during_a_warm_job_stops_it_and_the_session(tmp_path):
    script = textwrap.dedent(f"""
        import ddplab
        s = ddplab.Session(world_size=2, runs_dir={str(tmp_path / 'runs')!r})
        print("SESSION", s.dir, flush=True)
        try:
            ddplab.run(ddplab.Experiment(world_size=2, steps=100_000, local_batch=4, seq_len=8),
                       {str(tmp_path / 'long')!r}, progress=False)
        except KeyboardInterrupt as e:
            print("INTERRUPTED", e, flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, preexec_fn=ctrl_c_reaches_it)
    session_dir = Path(proc.stdout.readline().split()[1])
    deadline = time.monotonic() + 60
    while not any(rundir.read_progress(p, 1) for p in (tmp_path).glob(".long.*.partial")):
        assert time.monotonic() < deadline and proc.poll() is None, "the job never started"
        time.sleep(0.1)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=sessions.SESSION_TIMEOUT_S)
    took = time.monotonic() - t0
    assert "INTERRUPTED interrupted: 2 ranks stopped" in out, out
    assert _wait_gone(session_dir, 2) == []
    # Without the Ctrl-C the job runs 100,000 steps; a launcher that noticed it only when a collective
    # timed out would take the session's timeout. Stopping is a kill and a reap: on a busy machine
    # seconds (5.4 s seen in CI), never a large part of that timeout.
    assert took < sessions.SESSION_TIMEOUT_S / 3, f"{took:.1f} s from the Ctrl-C to the launcher's exit"


def test_a_launcher_that_dies_takes_its_session_with_it(tmp_path):
    script = textwrap.dedent(f"""
        import time, ddplab
        s = ddplab.Session(world_size=1, runs_dir={str(tmp_path / 'runs')!r})
        print("SESSION", s.dir, flush=True)
        time.sleep(120)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    session_dir = Path(proc.stdout.readline().split()[1])
    assert len(leftovers(session_dir)) >= 2   # torchrun and its rank, waiting for jobs
    os.kill(proc.pid, signal.SIGKILL)   # a kernel restart
    proc.wait()
    assert _wait_gone(session_dir, 5) == []


def test_a_session_started_on_a_short_lived_thread_outlives_it_and_reads_a_changed_model_file_again(
        tmp_path, monkeypatch):
    """A widget's click handler may run on a thread that ends when it returns; Linux's parent-death
    signal follows the thread that started torchrun, so the session must not be started from it.
    A user's model file changed between two jobs of that session is read again."""
    import threading

    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "lab_session_net.py").write_text(textwrap.dedent("""
        import torch.nn as nn
        WIDTH = 1
        def net(vocab_size, d_model):
            return nn.Sequential(nn.Embedding(vocab_size, d_model * WIDTH), nn.Linear(d_model * WIDTH, vocab_size))
    """))
    monkeypatch.chdir(tmp_path)   # the ranks import it from the current directory at the session's start
    exp = Experiment(name="net", model="lab_session_net:net", **ONE)
    box = []
    t = threading.Thread(target=lambda: box.append(ddplab.Session(world_size=1, runs_dir=tmp_path / "runs")))
    t.start()
    t.join()
    s = box[0]
    try:
        time.sleep(1.0)
        assert s.alive()
        first = ddplab.run(exp, tmp_path / "n1", progress=False)
        assert first.launch["session"] == s.dir.name
        path = tmp_path / "lab_session_net.py"
        path.write_text(path.read_text().replace("WIDTH = 1", "WIDTH = 2"))
        second = ddplab.run(exp.replace(seed=1), tmp_path / "n2", progress=False)
    finally:
        s.close()
    assert _wait_gone(s.dir, 5) == []
    assert first.launch["session"] == second.launch["session"] is not None
    assert second.ranks[0].model.parameter_count > first.ranks[0].model.parameter_count


def test_a_rank_killed_during_a_job_is_named_and_the_session_torn_down(tmp_path, warm):
    """SIGKILL leaves no error file: the rank is named as the one that left no word (as in a cold run)."""
    import threading

    import psutil

    exp = Experiment(name="killed", **{**SMALL, "steps": 100_000})

    def kill_rank_1():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for staged in tmp_path.glob(".killed.*.partial"):
                recs = rundir.read_progress(staged, 1)
                if recs and recs[-1]["step"] >= 1:
                    psutil.Process(recs[-1]["pid"]).kill()
                    return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_rank_1)
    killer.start()
    t0 = time.monotonic()
    with pytest.raises(RunFailed) as info:
        ddplab.run(exp, tmp_path / "killed", progress=False)
    killer.join()
    d = info.value.diagnosis
    assert d.kind == "missing-result" and d.ranks == [1], str(d)
    assert time.monotonic() - t0 < exp.timeout_s + 15
    assert not warm.alive() and sessions.current() is None
    assert _wait_gone(warm.dir, 5) == []


def test_a_jobs_user_modules_are_imported_afresh_but_torch_never(tmp_path, monkeypatch):
    import importlib
    import json
    import sys as _sys

    import torch.nn  # noqa: F401 - loaded, as in every rank

    from ddplab.rank import session as rank_session

    (tmp_path / "lab_fresh_mod.py").write_text("VERSION = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("lab_fresh_mod")
    spec = json.dumps({"model": "lab_fresh_mod:net"})
    rank_session.fresh_user_modules([spec, json.dumps({"model": "torch.nn:Linear"})])
    assert "lab_fresh_mod" not in _sys.modules and "torch.nn" in _sys.modules
    (tmp_path / "lab_fresh_mod.py").write_text("VERSION = 2\n")
    assert importlib.import_module("lab_fresh_mod").VERSION == 2


# -- run() starting sessions itself (warm=True, or by default in a Jupyter kernel) ------------------

def _pids(run) -> list[int]:
    return [r.pid for r in run.ranks]


def test_run_starts_a_session_keeps_it_and_replaces_it_when_too_small_or_its_directory_is_deleted(
        tmp_path, monkeypatch):
    import shutil

    monkeypatch.setenv("DDPLAB_RUNS", str(tmp_path / "runs"))
    first = ddplab.run(Experiment(name="a", **ONE), tmp_path / "a", progress=False, warm=True)
    s = sessions.current()
    try:
        assert s is not None and s.implicit and first.launch["session"] == s.dir.name
        assert s.dir.parent == tmp_path / "runs" / ".sessions"
        again = ddplab.run(Experiment(name="b", **ONE), tmp_path / "b", progress=False, warm=True)
        assert again.launch["session"] == s.dir.name and _pids(again) == _pids(first)   # the same processes
        cold = ddplab.run(Experiment(name="c", **ONE), tmp_path / "c", progress=False, warm=False)
        assert cold.launch["session"] is None and not set(_pids(cold)) & set(_pids(first)) and s.alive()
        wider = ddplab.run(Experiment(name="d", **SMALL), tmp_path / "d", progress=False, warm=True)
        bigger = sessions.current()
        assert bigger is not s and bigger.world_size == 2 and wider.launch["session"] == bigger.dir.name
        assert not s.alive() and _wait_gone(s.dir, 5) == []   # the 1-rank session made way
        shutil.rmtree(tmp_path / "runs")   # a learner cleaning up runs/ under a live notebook
        after = ddplab.run(Experiment(name="e", **ONE), tmp_path / "e", progress=False, warm=True)
        assert after.launch["session"] != wider.launch["session"] and not bigger.alive()   # it fits, but went
        assert _wait_gone(bigger.dir, 5) == []
    finally:
        sessions.close_current()
    assert sessions.current() is None and _wait_gone(tmp_path / "runs", 5) == []


def test_run_never_closes_a_session_you_opened(tmp_path, monkeypatch):
    monkeypatch.setenv("DDPLAB_RUNS", str(tmp_path / "runs"))
    with ddplab.Session(world_size=1, runs_dir=tmp_path / "mine") as mine:   # the smallest that a run outgrows
        wide = ddplab.run(Experiment(name="w", **SMALL), tmp_path / "w", progress=False, warm=True)
        assert wide.launch["session"] is None   # cold: it does not fit, and it is not run's to replace
        assert sessions.current() is mine and mine.alive()


def test_ctrl_c_while_run_starts_its_session_is_one_line_and_leaves_no_rank(tmp_path):
    script = textwrap.dedent(f"""
        import ddplab
        from ddplab.launch import session
        print("READY", flush=True)
        try:
            ddplab.run(ddplab.Experiment(world_size=2, local_batch=4, seq_len=8), {str(tmp_path / 'one')!r},
                       progress=False, warm=True)
        except ddplab.failures.Interrupted as e:
            print("INTERRUPTED", e, flush=True)
    """)
    env = {**os.environ, "DDPLAB_RUNS": str(tmp_path / "runs")}
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env,
                            preexec_fn=ctrl_c_reaches_it)
    assert proc.stdout.readline().strip() == "READY"
    deadline = time.monotonic() + 60
    # torchrun is starting: the launcher opened the session's log; its ranks need a second or more for
    # `import torch`, so 0.2 s later the session is still starting (a rank's first progress line came too
    # late: a fast start had sometimes finished, and the Ctrl-C then stopped the job instead)
    while not list((tmp_path / "runs" / ".sessions").glob("*/launch.log")):
        assert time.monotonic() < deadline and proc.poll() is None, "the session never started"
        time.sleep(0.02)
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    assert "INTERRUPTED interrupted: the session's 2 ranks stopped while starting" in out, out
    assert _wait_gone(tmp_path / "runs", 5) == []


@pytest.mark.parametrize("which", ["run", "session"])
def test_deleting_a_directory_under_a_warm_job_stops_it_and_names_that_directory(tmp_path, which):
    """A warm job whose run directory, or whose session's directory, is deleted stops its ranks as a
    cold launch does, and the diagnosis names the one that went."""
    import shutil
    import threading

    from ddplab.spec import Straggler

    s = ddplab.Session(world_size=2, runs_dir=tmp_path / "runs")
    out = tmp_path / "out"
    exp = Experiment(name="long", straggler=Straggler(rank=1, where="data", ms=300.0), **{**SMALL, "steps": 60})

    def delete():   # 3 s into an 18 s job
        for d in ([s.dir] if which == "session" else list(tmp_path.glob(".out.*.partial"))):
            shutil.rmtree(d, ignore_errors=True)
    timer = threading.Timer(3.0, delete)
    try:
        t0 = time.monotonic()
        timer.start()
        with pytest.raises(RunFailed) as e:
            ddplab.run(exp, out, progress=False, warm=True)
        took = time.monotonic() - t0
        assert e.value.diagnosis.kind == ("session-dir" if which == "session" else "run-dir"), str(e.value)
        assert took < 12, f"the job went on for {took:.1f} s after its directory was deleted at 3 s"
        assert not s.alive() and _wait_gone(s.dir, 5) == []
    finally:
        timer.cancel()
        s.close()


def test_a_ddp_cell_on_a_session_whose_directory_was_deleted_says_so(tmp_path):
    import shutil

    s = ddplab.Session(world_size=1, runs_dir=tmp_path / "runs")
    try:
        shutil.rmtree(s.dir)
        with pytest.raises(RuntimeError, match=r"this session's directory .* was deleted, so its ranks were stopped"):
            s.execute("1 + 1")
        assert not s.alive() and _wait_gone(s.dir, 5) == []
    finally:
        s.close()


def test_jobs_sent_at_the_idle_deadline_run_and_a_session_left_idle_leaves_by_itself(tmp_path, monkeypatch):
    """The launcher owns the idle clock and closes the session under the launch lock: a job sent just
    before the deadline runs on the session, one just after on a fresh one; neither fails (with
    each rank's own clock, a job at 4.95 s of 5 hung and one at 5.0-5.4 s lost its ranks). Each gap
    is timed from the end of the job before, which re-armed the clock. Then, left idle, the session
    closes itself and says so."""
    monkeypatch.setattr(sessions, "IDLE_S", 5.0)
    monkeypatch.setenv("DDPLAB_RUNS", str(tmp_path / "runs"))
    try:
        # two ranks: the hang this guards against came from ranks that disagreed about the deadline
        runs = [ddplab.run(Experiment(name="a", **SMALL), tmp_path / "a", progress=False, warm=True)]
        for name, gap_s in (("b", 4.95), ("c", 5.2)):
            time.sleep(gap_s)
            runs.append(ddplab.run(Experiment(name=name, **SMALL), tmp_path / name, progress=False, warm=True))
            assert runs[-1].launch.get("session") and runs[-2].launch.get("session"), f"the job {gap_s} s after"
        s = sessions.current()
        deadline = time.monotonic() + sessions.IDLE_S + 18
        while s.alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not s.alive() and sessions.current() is None
        assert sessions.last_end() == "it closed itself after 5 s without a job"   # what the next %%ddp cell says
        assert _wait_gone(s.dir, 5) == []
    finally:
        sessions.close_current()

