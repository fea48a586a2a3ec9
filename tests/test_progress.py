import json

from ddplab import Experiment, rundir
from ddplab.launch.progress import describe
from ddplab.launch.watch import Watch


def test_progress_line_names_the_slowest_rank():
    line = describe("demo", 4, [3, 2, 3, 3], 10, "backward", 4.25)
    assert line == "ddplab demo: 4 ranks, 2/10 steps done, slowest rank in 'backward' (4.2 s)"
    assert "1/4 ranks up" in describe("demo", 4, [0], 10, "init-process-group", 1.0)


def test_watch_reads_progress_incrementally_and_waits_for_whole_lines(tmp_path):
    exp = Experiment(world_size=2, steps=3)
    watch = Watch([(exp, tmp_path)])
    assert not watch.poll()
    rec = lambda phase, step: json.dumps({"t_ns": 0, "phase": phase, "step": step, "micro": 0}) + "\n"
    rundir.progress_file(tmp_path, 0).write_text(rec("forward", 0) + rec("optimizer", 0) + '{"t_ns": 1, "pha')
    rundir.progress_file(tmp_path, 1).write_text(rec("forward", 0))
    assert watch.poll()
    assert watch.steps_done[0] == {0: 1, 1: 0} and watch.last[0][0]["phase"] == "optimizer"
    assert "0/3 steps done, slowest rank in 'forward'" in watch.line(1.0)
    with open(rundir.progress_file(tmp_path, 0), "a") as f:
        f.write('se": "forward", "step": 1, "micro": 0}\n')
    assert watch.poll() and watch.last[0][0] == {"t_ns": 1, "phase": "forward", "step": 1, "micro": 0}
    assert not watch.poll()


def test_a_sweep_round_counts_as_done_only_once_the_next_one_starts(tmp_path):
    from ddplab import recipes

    exp = recipes.bucket_sweep(caps_mb=(1,), rounds=5)[1]
    watch = Watch([(exp, tmp_path)])
    rec = lambda step, plan: json.dumps({"t_ns": 0, "phase": "round", "step": step, "micro": 1, "detail": plan}) + "\n"
    rundir.progress_file(tmp_path, 0).write_text(rec(0, "ddp:1"))
    rundir.progress_file(tmp_path, 1).write_text(rec(0, "ddp:1") + rec(2, "plan:4"))
    watch.poll()
    assert watch.steps_done[0] == {0: 0, 1: 2}
    assert "0/5 rounds done, slowest rank in 'round ddp:1'" in watch.line(1.0)


def test_the_line_names_the_experiment_the_slowest_ranks_are_on(tmp_path):
    small, big = Experiment(name="small", world_size=2), Experiment(name="big", world_size=4)
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    watch = Watch([(small, a), (big, b)])
    rec = lambda phase, step: json.dumps({"t_ns": 0, "phase": phase, "step": step, "micro": 0}) + "\n"
    rundir.progress_file(a, 0).write_text(rec("forward", 0))
    for r in (2, 3):   # ranks outside the 2-rank experiment went on to the next one
        rundir.progress_file(b, r).write_text(rec("init-process-group", -1))
    watch.poll()
    assert "small" in watch.line(1.0) and "1/2 small" in watch.line(1.0)
    rundir.rank_file(a, 0).write_text("{}")
    rundir.rank_file(a, 1).write_text("{}")
    watch.poll()
    assert "2/2 big" in watch.line(2.0)


def test_a_callable_progress_gets_every_line_and_the_last_one(capsys):
    """A widget hands the launcher a callable (its label): an Output widget would freeze a display-id line."""
    from ddplab.launch.progress import Reporter

    seen = []
    r = Reporter(seen.append)
    assert not r.notebook and not r.tty
    r.update("starting 2 ranks")
    r.update("starting 2 ranks")   # unchanged: not sent again
    r.update("1/3 steps done")
    r.finish("done in 3.0 s")
    assert seen == ["starting 2 ranks", "1/3 steps done", "done in 3.0 s"]
    assert capsys.readouterr().err == ""   # nothing printed besides
    silent = Reporter(False)
    silent.update("x"), silent.finish("y")
    assert silent.history == []


def test_a_widget_hands_progress_only_to_a_measure_that_takes_it():
    from types import SimpleNamespace

    from ddplab.widgets.measuring import measure_with_progress

    label = SimpleNamespace(value="")

    def like_run(exp, out=None, *, progress=True):
        progress(f"running {exp}")
        return "run"

    assert measure_with_progress(like_run, "e", label) == "run" and label.value == "running e"
    assert measure_with_progress(lambda e: f"bare {e}", "e", label) == "bare e"   # a user's lambda still works
    assert measure_with_progress(lambda e, **kw: kw["progress"]("kw") or "kw", "e", label) == "kw"
    assert label.value == "kw"


def test_the_watch_names_a_stopped_rank_whatever_experiment_it_is_in(tmp_path):
    import signal
    import subprocess
    import time

    stopped = subprocess.Popen(["sleep", "30"])
    try:
        stopped.send_signal(signal.SIGSTOP)
        a, b = Experiment(name="a", world_size=2, steps=1), Experiment(name="b", world_size=2, steps=1)
        (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
        watch = Watch([(a, tmp_path / "a"), (b, tmp_path / "b")])
        rec = json.dumps({"t_ns": 0, "phase": "forward", "step": 0, "micro": 0, "pid": stopped.pid}) + "\n"
        rundir.progress_file(tmp_path / "a", 1).write_text(rec)   # rank 1 last wrote in the first experiment
        watch.poll()
        watch.last_move -= 5   # the launch has stood still
        time.sleep(0.2)
        watch.look_at_processes()
        assert watch.frozen == {1: "stopped"}
    finally:
        stopped.kill()
        stopped.wait()


def test_only_the_run_directory_failing_is_called_a_lost_run_directory(tmp_path):
    import errno

    from ddplab.launch.cold import _dir_lost

    assert not _dir_lost(tmp_path, OSError(errno.EAGAIN, "Resource temporarily unavailable"))   # a failed fork
    assert _dir_lost(tmp_path / "gone", OSError(errno.ENOENT, "No such file", "x"))
    assert _dir_lost(tmp_path, FileNotFoundError(errno.ENOENT, "No such file", str(tmp_path / "rank0.json")))
