"""The diagnosis is pure: these tests feed it per-rank records like the ones ranks write."""

import pytest

from ddplab.failures import diagnose, phase_key
from ddplab.spec import Train

T = 10.0
PHASES = Train().all_phases()   # the train task's phases, which these records name


def rec(phase, step=-1, micro=0, collective=None, t=0):
    r = {"t_ns": t, "phase": phase, "step": step, "micro": micro}
    if collective:
        r["collective"] = collective
    return r


def err(rank, message, t, typ="RuntimeError", phase="forward"):
    return {"rank": rank, "phase": phase, "step": 1, "t_ns": t, "type": typ, "message": message,
            "traceback": f"Traceback of rank {rank}\n{typ}: {message}"}


UP = [rec("init-process-group"), rec("ddp-construct"), rec("forward", 0), rec("backward", 0, collective="AR"),
      rec("optimizer", 0)]


def test_crash_blames_the_earliest_real_error_not_the_peers_that_lost_it():
    errors = {0: err(0, "Connection closed by peer [127.0.0.1]:4242", t=5),
              1: err(1, "injected fault: rank 1 crashed", t=3),
              2: err(2, "Connection reset by peer", t=4)}
    d = diagnose({r: UP for r in range(3)}, errors, set(), 3, T, False, PHASES)
    assert d.kind == "crash" and d.ranks == [1]
    assert "Rank 1 failed" in d.summary and "injected fault" in d.summary
    assert "ranks 0, 2 failed too" in d.summary
    assert "Traceback of rank 1" in str(d)


def test_hang_names_the_rank_that_went_to_another_collective():
    progress = {0: UP + [rec("forward", 1), rec("backward", 1, collective="DDP gradient all-reduce")],
                1: UP + [rec("forward", 1), rec("skip-backward", 1, collective="barrier")],
                2: UP + [rec("forward", 1), rec("backward", 1, collective="DDP gradient all-reduce")]}
    errors = {0: err(0, "Timed out waiting 10000ms for recv operation to complete", t=9)}
    d = diagnose(progress, errors, set(), 3, T, False, PHASES)
    assert d.kind == "hang" and d.ranks == [1]
    assert "Ranks 0, 2 waited in the DDP gradient all-reduce" in d.summary
    assert "Rank 1 never arrived" in d.summary and "barrier" in d.summary
    assert "timed out after timeout_s=10 s" in d.summary


def test_hang_names_a_rank_that_is_behind_outside_any_collective():
    progress = {0: UP + [rec("forward", 1), rec("backward", 1, collective="AR")],
                1: UP + [rec("forward", 1)]}
    d = diagnose(progress, {}, set(), 2, T, True, PHASES)
    assert d.ranks == [1] and "outside any collective" in d.summary
    assert "ddplab stopped the run" in d.summary


def test_hang_with_a_rank_that_never_started():
    d = diagnose({0: [rec("init-process-group", collective="rendezvous")]}, {}, set(), 2, T, True, PHASES)
    assert d.ranks == [1] and "never started" in d.summary


def test_rank_that_vanished_without_a_file_is_a_missing_result():
    d = diagnose({0: UP, 1: UP[:3]}, {}, {0}, 2, T, False, PHASES)
    assert d.kind == "missing-result" and d.ranks == [1]
    assert "'forward' of step 0" in d.summary


def test_a_rank_killed_by_a_signal_is_blamed_not_the_peer_that_lost_it():
    errors = {0: err(0, "Connection closed by peer [127.0.0.1]:4242", t=5)}
    d = diagnose({0: UP, 1: UP[:3]}, errors, set(), 2, T, False, PHASES)
    assert d.kind == "missing-result" and d.ranks == [1]
    assert "rank 0 then lost the connection" in d.summary


def test_phase_key_orders_setup_steps_and_teardown_by_the_tasks_phases():
    keys = [phase_key(r, PHASES) for r in (rec("init-process-group"), rec("ddp-construct"), rec("forward", 0),
                                           rec("backward", 0), rec("optimizer", 0), rec("forward", 1),
                                           rec("forward", 1, micro=1), rec("teardown"))]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    assert phase_key(rec("skip-backward", 1), PHASES) == phase_key(rec("backward", 1), PHASES)


def test_a_frozen_rank_is_blamed_even_inside_the_collective_the_others_wait_in():
    same = UP + [rec("forward", 1), rec("backward", 1, collective="DDP gradient all-reduce")]
    progress = {r: same for r in range(3)}
    errors = {0: err(0, "Timed out waiting 10000ms for recv operation to complete", t=9)}
    # without the process state, the records cannot tell who is to blame
    assert diagnose(progress, errors, set(), 3, T, False, PHASES).ranks == [0, 1, 2]
    d = diagnose(progress, errors, set(), 3, T, False, PHASES, frozen={2: "stopped"})
    assert d.kind == "hang" and d.ranks == [2], str(d)
    assert d.summary.startswith("Rank 2 was stopped (its process was in state 'stopped'")
    assert "in 'backward' of step 1" in d.summary
    assert "Ranks 0, 1 waited for it in the DDP gradient all-reduce" in d.summary
    assert "timed out after timeout_s=10 s" in d.summary


def test_a_real_crash_still_wins_over_a_frozen_peer():
    errors = {1: err(1, "injected fault: rank 1 crashed", t=3)}
    d = diagnose({r: UP for r in range(3)}, errors, set(), 3, T, False, PHASES, frozen={2: "stopped"})
    assert d.kind == "crash" and d.ranks == [1]


def test_the_launch_is_blamed_on_the_earliest_error_not_on_the_narrower_run_torchrun_stopped(tmp_path):
    # a rank outside the 2-rank run failed in the next, 4-rank run; torchrun then stopped ranks 0 and 1
    # mid-step in the 2-rank run, which left no result and no error of their own
    import json
    import types

    from ddplab import Experiment, rundir
    from ddplab.launch import diagnosis

    narrow, wide = Experiment(name="narrow", world_size=2), Experiment(name="wide", world_size=4)
    dirs = [tmp_path / "narrow", tmp_path / "wide"]
    for d in dirs:
        d.mkdir()
    for r in (0, 1):
        rundir.progress_file(dirs[0], r).write_text(json.dumps({"phase": "forward", "step": 3, "t_ns": 1}) + "\n")
    (tmp_path / rundir.LOG).write_text("")
    proc = types.SimpleNamespace(returncode=None)

    def blamed(message):
        rundir.error_file(dirs[1], 2).write_text(json.dumps({
            "rank": 2, "phase": "forward", "step": 0, "t_ns": 5, "type": "RuntimeError", "message": message,
            "traceback": f"Traceback ...\nRuntimeError: {message}"}))
        return diagnosis.first_failure([narrow, wide], dirs, tmp_path, proc, 60.0, False, tmp_path / "spec.json", {},
                                   tmp_path)

    own = blamed("mat1 and mat2 shapes cannot be multiplied")
    assert own.run_dir == dirs[1] and "mat1 and mat2" in str(own)
    # a timeout in the later run is a consequence (a rank still busy in the earlier one): the earlier is blamed
    assert blamed("Timed out waiting 60000ms for recv operation to complete").run_dir == dirs[0]
    rundir.error_file(dirs[1], 2).unlink()   # no error at all: the first run that left no result
    assert diagnosis.first_failure([narrow, wide], dirs, tmp_path, proc, 60.0, False, tmp_path / "spec.json", {},
                               tmp_path).run_dir == dirs[0]


def test_an_allreduce_sweep_killed_while_allocating_is_placed_in_that_phase(monkeypatch):
    """A 4 GiB sweep killed for memory was labelled 'init-process-group': the sweep enters
    'allocate buffers' before it allocates, so the last phase its progress log shows is that one."""
    import types

    from ddplab.rank.tasks import allreduce_sweep
    from ddplab.spec import AllReduceSweep, Experiment

    entered = []
    ctx = types.SimpleNamespace(exp=Experiment(task=AllReduceSweep(sweep_bytes=(4096,), repeats=1)), group=None,
                                device="cpu", log=types.SimpleNamespace(enter=lambda phase, *a, **k: entered.append(phase)))

    def out_of_memory(*a, **k):
        raise MemoryError("the kernel would have killed the rank here")
    monkeypatch.setattr(allreduce_sweep.torch, "ones", out_of_memory)
    with pytest.raises(MemoryError):
        allreduce_sweep.run(ctx)
    assert entered == ["allocate buffers"]
    assert "allocate buffers" in AllReduceSweep().all_phases()
