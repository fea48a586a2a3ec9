"""The `%%ddp` cell magic: every rank runs the cell, state stays from cell to
cell, outputs come back side by side, an exception names its rank, a hang is bounded and the
session then stops, and no rank outlives `%ddp_stop`."""

from __future__ import annotations

import re
import time

import pytest

from ddplab.launch import cells, session as sessions
from ddplab.magic import CellFailed

from tests.support import leftovers

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ip():
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "ddplab")
    yield shell
    if sessions.current() is not None:
        shell.run_line_magic("ddp_stop", "")


def _cell(ip, code: str, line: str = ""):
    """Run a %%ddp cell; return (the CellResult it displayed, the exception it raised or None)."""
    from IPython.utils.capture import capture_output

    error = None
    with capture_output() as cap:
        try:
            ip.run_cell_magic("ddp", line, code)
        except CellFailed as e:
            error = e
    shown = [o for o in cap.outputs if "text/html" in o.data]
    assert shown, "the cell displayed nothing"
    return shown[-1], error


def _tree(session) -> set[int]:
    """The pids of the session's torchrun and every process under it."""
    import psutil

    top = psutil.Process(session.proc.pid)
    return {top.pid} | {p.pid for p in top.children(recursive=True)}


def test_every_rank_runs_the_cell_and_keeps_its_state(ip):
    ip.run_line_magic("ddp_start", "-n 2 --timeout 3")
    session = sessions.current()
    out, error = _cell(ip, "print(f'hello from rank {rank} of {world_size}')\n"
                           "x = torch.tensor([rank + 1.0])\ndist.all_reduce(x)\nx")
    assert error is None
    html = out.data["text/html"]
    assert "hello from rank 0 of 2" in html and "hello from rank 1 of 2" in html
    assert html.count("tensor([3.])") == 2   # 1 + 2 on both ranks
    assert ip.user_ns["_ddp"].value(1) == "tensor([3.])"   # the answers, for the notebook's own checks
    again = session.execute("x * 2")           # the namespace survives the cell
    assert [again[r]["value"] for r in (0, 1)] == ["tensor([6.])", "tensor([6.])"]
    before = _tree(session)
    session.execute("print(rank)")
    # warm: the same torchrun and ranks ran it, nothing was launched (bench/session_latency.py times it)
    assert _tree(session) == before and session.alive()


def test_an_exception_shows_its_rank_and_traceback_and_the_session_goes_on(ip):
    out, error = _cell(ip, "y = 10 / (rank - 1)\ny")
    assert error is not None and "rank 1: ZeroDivisionError: division by zero" in str(error)
    html = out.data["text/html"]
    assert "-10.0" in html and "ZeroDivisionError" in html and "&lt;%%ddp cell&gt;" in html
    assert "cells.py" not in html and "eval(compile" not in html   # the traceback starts in the learner's code
    assert sessions.current() is not None and sessions.current().execute("rank")[1]["value"] == "1"


def test_the_labs_probes_measure_a_loop_typed_in_cells(ip):
    session = sessions.current()
    setup = session.execute(
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "torch.manual_seed(0)\n"
        "model = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 4))\n"
        "ddp = DDP(model, bucket_cap_mb=0.5)\n"
        "opt = torch.optim.Adam(ddp.parameters())\n"
        "ready, buckets = lab.watch_ready(model), lab.watch_buckets(ddp)\n"
        "ddp(torch.randn(8, 512)).sum().backward()\n"
        "opt.step()\n"
        "first = buckets.buckets()\n"
        "opt.zero_grad(); buckets.start()\n"
        "ddp(torch.randn(8, 512)).sum().backward()\n"
        "(ready.ready_ms(), first, buckets.buckets(), lab.memory(model, opt, buckets))")
    assert all(v["error"] is None for v in setup.values()), setup
    import ast

    ready, first, buckets, memory = ast.literal_eval(setup[0]["value"])
    assert [name for name, _ in ready][0] == "4.bias"   # backward meets the last layer first
    assert len(ready) == 12 and all(ms > 0 for _, ms in ready)   # 6 gradients, 2 backwards
    assert len(first) == 1 and first[0]["params"] == 6   # DDP's first iteration: one bucket for everything
    # rebuilt from the ready order: a first bucket of up to 1 MiB, then 0.5 MiB ones
    assert len(buckets) >= 2 and all(b["done_ms"] >= b["launch_ms"] for b in buckets), buckets
    params = (2 * (512 * 512 + 512) + 512 * 4 + 4) * 4 / 2**20
    assert abs(memory["parameters"] - params) < 1e-3 and abs(memory["optimizer_state"] - 2 * params) < 1e-3


def test_a_subset_of_ranks(ip):
    out, error = _cell(ip, "print('only me', rank)", line="--ranks 1")
    assert error is None
    html = out.data["text/html"]
    assert "rank 1" in html and "rank 0" not in html and "only me 1" in html


def test_after_a_cell_runs_go_cold_so_a_cell_cannot_change_a_run(ip, tmp_path):
    import ddplab
    from ddplab import Experiment

    session = sessions.current()
    session.execute("torch.set_default_dtype(torch.float64)")   # would change every parameter a job builds
    # one rank: it fits the 2-rank session, so only the cell that ran on it keeps the run off it
    exp = Experiment(name="after-cell", world_size=1, steps=1, local_batch=2, seq_len=4)
    run = ddplab.run(exp, tmp_path / "after-cell", progress=False)
    assert run.launch["session"] is None and session.alive()
    session.execute("torch.set_default_dtype(torch.float32)")


def _short_session(ip):
    """A live session of 2 ranks whose collectives time out after 3 s (a cell that hangs restarts one
    alike): the one the last test left (once its restart is done), or a new one."""
    cells.restarted()
    s = sessions.current()
    if s is None or not s.alive() or s.world_size != 2 or s.timeout_s != 3:
        ip.run_line_magic("ddp_start", "-n 2 --timeout 3")
    return sessions.current()


def test_the_rank_that_skipped_a_collective_is_named_and_where_each_rank_waits_shows_while_it_hangs(ip):
    """Issue 53: while the cell hangs, each rank's state and wait, every second, and when it will stop; the
    failure within the timeout + 5 s, the waiting rank's stack taken inside its collective and the rank that
    finished said to be idle, and the cell's first collective numbered #1."""
    session = _short_session(ip)
    t0 = time.monotonic()
    shown, error = _shown_while_running(ip, "if rank != 0:\n    dist.all_reduce(torch.ones(1))")
    seconds = time.monotonic() - t0
    text = str(error)
    assert error is not None, "rank 1 waited in an all_reduce rank 0 never called"
    assert seconds <= session.timeout_s + cells.CELL_GRACE_S, seconds
    assert "rank 0: finished the cell without joining the collective rank(s) 1 waited in" in text, text
    assert ("rank(s) 0 never joined collective #1 of this cell in group 0:default_pg (gloo:all_reduce; torch's flight "
            "recorder numbers it #") in text, text
    running = [h for h in shown if "running..." in h]
    for s in (1, 2):   # shown at least every second while it waits
        assert any(f"rank 1: in dist.all_reduce #1 (shape (1,) float32) for {s} s" in h and
                   "rank 0: finished the cell" in h and "the cell is stopped by 8 s" in h for h in running), running
    assert "where rank 1 was when the launcher asked (waiting in dist.all_reduce #1 (shape (1,) float32) for" in \
        shown[-1] and "where rank 0 was when the launcher asked (idle, between cells: it had finished" in shown[-1]
    assert not session.alive()


def test_a_collective_only_some_ranks_call_is_named_by_torch_and_the_ranks_come_back(ip):
    """Within the cell's timeout + 2 s, rank, collective and sequence number (torch's flight
    recorder analyzer on the ranks' records), each rank's stack; the ranks restarted, the next cell runs."""
    session = _short_session(ip)
    ip.run_cell_magic("ddp", "", "x = torch.ones(2)\ndist.all_reduce(x)")   # one collective both ranks join
    t0 = time.monotonic()
    out, error = _cell(ip, "dist.all_reduce(torch.ones(1))", line="--ranks 0")
    assert time.monotonic() - t0 <= session.timeout_s + cells.CELL_GRACE_S   # the restart is not the cell's
    text = str(error)
    assert error is not None and text.count("rank 0:") == 1, text
    assert re.search(r"rank\(s\) 1 never joined collective #1 of this cell in group \S+ \(gloo:all_reduce; torch's "
                     r"flight recorder numbers it #3, after the session's start-up barrier and 1 collective\(s\) of "
                     r"earlier cells\)", text), text
    assert "2 new ones are starting: the next %%ddp cell waits for them" in text and "variables are gone" in text, text
    shown = out.data["text/html"]
    assert "where rank 1 was when the launcher asked (idle, between cells: it was not in this cell)" in shown and \
        "session.py" in shown, shown
    flight = ip.user_ns["_ddp"].flight
    assert flight.ranks == [1] and (flight.seq, flight.earlier) == (3, 2), str(flight)   # after the one both joined
    ip.run_cell_magic("ddp", "", "rank")   # the next cell runs, no %ddp_start, no kernel restart
    assert ip.user_ns["_ddp"].value(1) == "1"
    assert not session.alive() and sessions.current() is not session and sessions.current().alive()
    deadline = time.monotonic() + 5
    while leftovers(session.dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert leftovers(session.dir) == []


def test_a_rank_whose_own_code_never_ends_is_told_apart_from_one_waiting_in_a_collective(ip):
    session = _short_session(ip)
    t0 = time.monotonic()
    out, error = _cell(ip, "if rank == 1:\n    while True:\n        pass\nelse:\n    dist.all_reduce(torch.ones(3))")
    assert time.monotonic() - t0 <= session.timeout_s + cells.CELL_GRACE_S   # testimonies and teardown included
    text = str(error)
    assert "rank 1: never finished, and not inside any collective called through the cell's `dist`" in text, text
    assert "rank 0:" in text, text


def test_ranks_calling_one_collective_with_different_sizes_are_told_so(ip):
    _short_session(ip)
    out, error = _cell(ip, "dist.all_reduce(torch.ones(4 if rank == 0 else 8))")
    text = str(error)
    assert "called dist.all_reduce with shape (4,) float32, and the ranks' calls differ (rank 0: shape (4,) " \
           "float32; rank 1: shape (8,) float32)" in text, text


@pytest.mark.parametrize("code, said", [
    ("import os, signal\nif rank == 0:\n    os.kill(os.getppid(), signal.SIGKILL)\nimport time; time.sleep(2)",
     "torchrun, the session's launcher, was killed by SIGKILL, and its ranks went with it"),
    ("import os\nif rank == 1:\n    os._exit(3)\nimport time; time.sleep(2)",
     "rank 1 exited with code 3, so torchrun stopped rank 0 and the session (exit code 1)"),
])
def test_a_cell_that_kills_torchrun_or_a_rank_says_who_died_not_which_rank_waited(ip, code, said):
    """A cell that killed torchrun blamed rank 1; now the death is said as it happened."""
    session = _short_session(ip)   # the last test's, if it lives; the cell kills it either way
    out, error = _cell(ip, code)
    assert error is not None and f"the session died during the cell: {said}" in str(error), str(error)
    with pytest.raises(CellFailed, match="the last one ended: " + re.escape(said)):
        ip.run_cell_magic("ddp", "", "rank")
    assert leftovers(session.dir) == []


def _shown_while_running(ip, code: str, interrupt_after_s: float | None = None):
    """Run a %%ddp cell; every HTML it put on the page, in order (the live updates, then the answer), and
    the exception it raised or None."""
    import os
    import signal
    import threading

    from IPython.utils.capture import capture_output

    from ddplab.failures import Interrupted

    timer = threading.Timer(interrupt_after_s, os.kill, (os.getpid(), signal.SIGINT)) if interrupt_after_s else None
    error = None
    with capture_output() as cap:
        if timer:
            timer.start()
        try:
            ip.run_cell_magic("ddp", "", code)
        except (CellFailed, Interrupted) as e:
            error = e
    return [o.data["text/html"] for o in cap.outputs if "text/html" in o.data], error


def test_what_the_ranks_print_shows_while_the_cell_runs(ip):
    """A loop's prints appear in each rank's column while it runs, not only at the end."""
    _short_session(ip)
    shown, error = _shown_while_running(ip, "import time\nfor i in range(4):\n    print(f'tick {i} on rank {rank}', "
                                            "flush=True)\n    time.sleep(0.5)")
    assert error is None
    running = [h for h in shown if "running..." in h]
    assert any("tick 0 on rank 0" in h and "tick 3" not in h for h in running), shown   # before the loop ended
    assert "tick 3 on rank 1" in shown[-1] and "running..." not in shown[-1]


def test_an_interrupted_cell_keeps_what_the_ranks_printed(tmp_path):
    """Ctrl-C (Kernel > Interrupt) in a loop: what the ranks printed stays on the page, marked as stopped.
    In a process of its own: the interrupt must reach the main thread (a pytest-xdist worker's is its own)."""
    import json
    import signal
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    from tests.support import ctrl_c_reaches_it

    script = textwrap.dedent(f"""
        import json
        from IPython.core.interactiveshell import InteractiveShell
        from IPython.utils.capture import capture_output
        from ddplab.failures import Interrupted
        from ddplab.launch import session
        ip = InteractiveShell.instance()
        ip.run_line_magic("load_ext", "ddplab")
        ip.run_line_magic("ddp_start", "-n 2 --timeout 30")
        print("SESSION", session.current().dir, flush=True)
        with capture_output() as cap:
            try:
                ip.run_cell_magic("ddp", "", "import time\\nfor i in range(600):\\n    print(f'step {{i}}')\\n    time.sleep(0.1)")
            except Interrupted as e:
                print("INTERRUPTED", e, flush=True)
        shown = [o.data["text/html"] for o in cap.outputs if "text/html" in o.data]
        print("LAST", json.dumps(shown[-1]), flush=True)
        print(cap.stdout, flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            preexec_fn=ctrl_c_reaches_it, cwd=tmp_path)
    line = ""
    while not line.startswith("SESSION"):   # (%ddp_start's display prints its repr first here)
        line = proc.stdout.readline()
        assert line or proc.poll() is None, "the session never started"
    session_dir = Path(line.split()[1])
    stream = session_dir / "job0.rank1.cell.stream"
    deadline = time.monotonic() + 60
    while not (stream.exists() and "step 3" in stream.read_text()):
        assert time.monotonic() < deadline and proc.poll() is None, "the loop never printed"
        time.sleep(0.05)
    time.sleep(0.3)   # a few more lines, and one live update of the page
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    last = json.loads(next(line for line in out.splitlines() if line.startswith("LAST "))[5:])
    assert "INTERRUPTED interrupted" in out, out
    assert "interrupted: the ranks were stopped" in last and "step 3" in last, last
    deadline = time.monotonic() + 5
    while leftovers(session_dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert leftovers(session_dir) == []


def test_ddp_start_says_what_it_waits_for_from_the_first_second(ip):
    from IPython.utils.capture import capture_output

    with capture_output() as cap:
        ip.run_line_magic("ddp_start", "-n 2 --timeout 3")
    html = [o.data["text/html"] for o in cap.outputs if "text/html" in o.data]
    assert html[0].startswith("<small>starting 2 ranks: torchrun, then each rank imports torch")   # at once
    assert "2 ranks ready on gloo/cpu" in html[-1]


def test_ddp_stop_leaves_no_rank(ip):
    session = _short_session(ip)   # the one the %ddp_start test above started
    assert session.alive() and len(leftovers(session.dir)) >= 3   # torchrun and its 2 ranks, to be stopped
    ip.run_line_magic("ddp_stop", "")
    deadline = time.monotonic() + 5
    while leftovers(session.dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert leftovers(session.dir) == [] and sessions.current() is None
    with pytest.raises(CellFailed, match="no session"):
        ip.run_cell_magic("ddp", "", "rank")


def test_cells_never_run_on_the_session_ddplab_run_keeps(ip, tmp_path):
    """`ddplab.run` replaces its own session when a run needs more ranks: a cell's state would vanish."""
    s = sessions.Session(world_size=1, runs_dir=tmp_path, implicit=True)   # one rank: no cell runs on it at all
    try:
        with pytest.raises(CellFailed, match="no session for %%ddp cells"):
            ip.run_cell_magic("ddp", "", "rank")
        assert s.alive() and s.cells == 0
    finally:
        s.close()
