import io
import json
import sys

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
    # a rank that finished did every round, though its last round record counted only the ones before
    with open(rundir.progress_file(tmp_path, 1), "a") as f:
        f.write(rec(4, "plan:4") + json.dumps({"t_ns": 0, "phase": "done", "step": -1, "micro": 0}) + "\n")
    watch.poll()
    assert watch.steps_done[0] == {0: 0, 1: 5}


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


class _Terminal(io.StringIO):
    """stderr as a terminal: the reporter draws its bars into it."""

    def isatty(self):
        return True


def _log(run_dir, exp, rank, *entries):
    """Write rank `rank`'s progress log as the rank does: (phase, step[, detail]) per entry."""
    log = rundir.ProgressLog(run_dir, rank, exp.task.all_phases())
    for phase, step, *detail in entries:
        log.enter(phase, step, detail=detail[0] if detail else None)
    log.close()


def test_each_rank_gets_a_bar_with_its_steps_and_phase(tmp_path, monkeypatch):
    from ddplab.launch.progress import Reporter

    monkeypatch.setattr(sys, "stderr", _Terminal())
    exp = Experiment(name="demo", world_size=2, steps=3)
    watch = Watch([(exp, tmp_path)])
    _log(tmp_path, exp, 0, ("forward", 0), ("backward", 0), ("optimizer", 0), ("forward", 1), ("backward", 1))
    _log(tmp_path, exp, 1, ("forward", 0))
    watch.poll()
    assert watch.ranks() == (0, exp, {0: (1, "backward"), 1: (0, "forward")})
    reporter = Reporter()
    reporter.update("ddplab demo: starting 2 ranks")
    reporter.watch(watch, 1.0)
    seen = {r: (b.desc, b.n, b.total, b.unit, b.postfix) for r, b in reporter.bars.items()}
    assert seen == {0: ("rank 0", 1, 3, "steps", "phase=backward"), 1: ("rank 1", 0, 3, "steps", "phase=forward")}
    shown = sys.stderr.getvalue()
    assert "ddplab demo: starting 2 ranks\n" in shown   # the starting line stays above the bars
    assert "rank 0:  33%" in shown and "1/3" in shown and "phase=backward" in shown
    assert reporter.history == ["ddplab demo: starting 2 ranks", watch.line(1.0)]   # the line is still kept
    watch.frozen = {1: "stopped"}   # Ctrl-Z on rank 1: its bar says so
    assert watch.ranks()[2][1] == (0, "forward (stopped)")


def test_the_bars_move_to_the_next_experiment_of_a_sweep(tmp_path, monkeypatch):
    from ddplab import recipes
    from ddplab.launch.progress import Reporter

    monkeypatch.setattr(sys, "stderr", _Terminal())
    wide, sweep = Experiment(name="wide", world_size=4, steps=2), recipes.bucket_sweep(caps_mb=(1,), rounds=5)[1]
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    watch = Watch([(wide, a), (sweep, b)])
    for r in range(4):
        _log(a, wide, r, ("forward", 0), ("optimizer", 0))
    watch.poll()
    reporter = Reporter()
    reporter.watch(watch, 1.0)
    first = dict(reporter.bars)
    assert [(b.desc, b.n, b.total) for b in first.values()] == [(f"1/2 wide rank {r}", 1, 2) for r in range(4)]
    for r in range(4):
        rundir.rank_file(a, r).write_text("{}")
    _log(b, sweep, 0, ("round", 0, "ddp:1"), ("round", 3, "plan:4"))
    _log(b, sweep, 1, ("round", 0, "ddp:1"))
    watch.poll()
    before = len(sys.stderr.getvalue())
    reporter.watch(watch, 2.0)
    assert "wide" not in sys.stderr.getvalue()[before:]   # a dropped bar clears its line, draws nothing
    seen = {r: (b.desc, b.n, b.total, b.unit, b.postfix) for r, b in reporter.bars.items()}
    assert seen == {0: ("2/2 bucket-sweep-w2 rank 0", 3, 5, "rounds", "phase=round plan:4"),
                    1: ("2/2 bucket-sweep-w2 rank 1", 0, 5, "rounds", "phase=round ddp:1")}
    assert first[2].disable and first[3].disable   # ranks 2 and 3 are not in the sweep: their bars closed


def test_the_final_line_follows_the_closed_bars_unchanged(tmp_path, monkeypatch):
    from ddplab.launch.progress import Reporter

    monkeypatch.setattr(sys, "stderr", _Terminal())
    exp = Experiment(name="demo", world_size=2, steps=1)
    watch = Watch([(exp, tmp_path)])
    for r in range(2):
        _log(tmp_path, exp, r, ("forward", 0), ("optimizer", 0), ("done", 0))
    watch.poll()
    reporter = Reporter()
    reporter.watch(watch, 1.0)
    bars = list(reporter.bars.values())
    final = "ddplab demo: 2 ranks x 1 step on gloo/cpu in 1.0 s -> /tmp/x"
    reporter.finish(final)
    assert reporter.bars == {} and all(b.disable for b in bars)
    shown = sys.stderr.getvalue()
    assert shown.endswith("\r\033[K" + final + "\n") and shown.rindex("rank 1") < shown.rindex(final)
    assert reporter.history == [watch.line(1.0)]   # as before: a terminal's final line is printed, not kept


def test_no_bars_when_silent_for_a_callable_or_outside_a_terminal(tmp_path, monkeypatch):
    from ddplab.launch.progress import Reporter

    exp = Experiment(name="demo", world_size=2, steps=3)
    watch = Watch([(exp, tmp_path)])
    _log(tmp_path, exp, 0, ("forward", 0))
    watch.poll()
    silent = Reporter(False)
    silent.watch(watch, 1.0)
    assert silent.bars == {} and silent.history == []
    seen = []
    label = Reporter(seen.append)
    label.watch(watch, 1.0)
    assert label.bars == {} and seen == [watch.line(1.0)]   # a widget's label keeps getting the line
    monkeypatch.setattr(sys, "stderr", io.StringIO())   # a pipe, a CI log
    piped = Reporter()
    piped.watch(watch, 1.0)
    piped.finish("ddplab demo: done")
    assert piped.bars == {} and sys.stderr.getvalue() == "ddplab demo: done\n"


def test_a_bar_that_cannot_draw_leaves_the_line_in_its_place(tmp_path, monkeypatch):
    import types

    from tqdm.std import tqdm as text_tqdm

    from ddplab.launch.progress import Reporter, bar_class

    monkeypatch.setitem(sys.modules, "tqdm.auto", types.SimpleNamespace(tqdm=text_tqdm))   # no ipywidgets
    assert bar_class(notebook=True) is None and bar_class(notebook=False) is text_tqdm
    monkeypatch.setattr(sys, "stderr", _Terminal())
    exp = Experiment(name="demo", world_size=2, steps=3)
    watch = Watch([(exp, tmp_path)])
    _log(tmp_path, exp, 0, ("forward", 0))
    watch.poll()
    reporter = Reporter()

    def broken(**kw):
        raise ImportError("IProgress not found")

    reporter._tqdm = broken
    reporter.watch(watch, 1.0)
    assert reporter.bars == {} and sys.stderr.getvalue().endswith("\r\033[K" + watch.line(1.0))
