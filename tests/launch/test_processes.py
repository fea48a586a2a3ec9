"""The process rules (`ddplab/processes.py`) on real short-lived processes: a process keeps its identity,
a dead or recycled pid is told apart from the process it named, only a living rank of ours is signalled,
and the keeper, run as a script, loads those rules without the ddplab package or torch."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

from ddplab import processes
from ddplab.launch import keeper

# a stand-in rank: `python -m ddplab.rank.worker` resolved in a folder of its own, so its command line is a
# rank's; it writes the path in argv[1] when the witness signal reaches it, and sleeps
STAND_IN = ("import pathlib, signal, sys, time\n"
            "signal.signal(signal.SIGUSR2, lambda *_: pathlib.Path(sys.argv[1]).write_text('{}'))\n"
            "print('ready', flush=True)\n"
            "time.sleep(60)\n")


def _stand_in_rank(tmp_path: Path, testimony: Path) -> subprocess.Popen:
    pkg = tmp_path / "ddplab" / "rank"
    pkg.mkdir(parents=True)
    (tmp_path / "ddplab" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "worker.py").write_text(STAND_IN)
    p = subprocess.Popen([sys.executable, "-m", processes.WORKER, str(testimony)], cwd=tmp_path,
                         stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": ""})
    assert p.stdout.readline().strip() == "ready"
    return p


def _ended(p: subprocess.Popen) -> int:
    """Kill `p` and reap it: its pid now names no process (until the kernel gives it again)."""
    p.kill()
    p.wait()
    return p.pid


def test_a_process_keeps_its_identity_and_a_dead_one_has_none():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        first, again = processes.identity(p.pid), processes.identity(p.pid)
        assert first is not None and first == again
        assert first["start_ticks"] == processes.start_ticks(p.pid) > 0
        mine = processes.identity(os.getpid())
        assert (first["boot"], first["pidns"]) == (mine["boot"], mine["pidns"])
        assert first["start_ticks"] >= mine["start_ticks"]   # started after this process
    finally:
        _ended(p)
    assert processes.identity(p.pid) is None and processes.start_ticks(p.pid) is None


def test_a_recorded_process_is_gone_once_it_ended_or_its_pid_was_given_again():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    record = {"pid": p.pid, "host": socket.gethostname(), **processes.identity(p.pid)}
    try:
        assert not processes.is_gone(record)
    finally:
        _ended(p)
    assert processes.is_gone(record)
    recycled = {**record, "pid": os.getpid()}   # a live pid, whose process started at another time
    assert processes.is_gone(recycled)
    assert not processes.is_gone({**record, "host": "another-node"})   # another host's: it may live
    assert not processes.is_gone({**record, "boot": "another-boot"})


def test_only_a_living_rank_of_ours_is_a_live_rank(tmp_path):
    testimony = tmp_path / "rank0.witness.json"
    rank = _stand_in_rank(tmp_path, testimony)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "-m", processes.WORKER])
    try:
        ticks = processes.start_ticks(rank.pid)
        assert processes.is_live_rank(rank.pid) and processes.is_live_rank(rank.pid, ticks)
        assert not processes.is_live_rank(rank.pid, ticks + 1)   # a recycled pid: another process
        assert not processes.is_live_rank(other.pid)   # its first option is -c: the worker module is an argument
    finally:
        _ended(other)
    rank.kill()
    deadline = time.monotonic() + 30
    while psutil.Process(rank.pid).status() != psutil.STATUS_ZOMBIE:   # killed, not yet reaped
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert not processes.is_live_rank(rank.pid, ticks)
    rank.wait()
    assert not processes.is_live_rank(rank.pid)


def test_the_witness_signal_reaches_the_rank_it_names_and_not_a_recycled_pid(tmp_path):
    testimony = tmp_path / "rank0.witness.json"
    rank = _stand_in_rank(tmp_path, testimony)
    try:
        ticks = processes.start_ticks(rank.pid)
        asked = processes.ask_witnesses({0: (rank.pid, ticks + 1)}, lambda r: tmp_path / f"rank{r}.witness.json",
                                        wait_s=0.2)
        assert asked == [] and not testimony.exists() and rank.poll() is None
        asked = processes.ask_witnesses({0: (rank.pid, ticks)}, lambda r: tmp_path / f"rank{r}.witness.json",
                                        wait_s=30)
        assert asked == [0] and testimony.exists() and rank.poll() is None   # it answered, and lives
    finally:
        _ended(rank)


def test_a_process_that_asked_to_die_with_its_parent_does():
    """The parent arms PR_SET_PDEATHSIG in its child (as the launcher does for the keeper) and is killed."""
    code = ("import subprocess, sys, time\n"
            "from ddplab import processes\n"
            "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
            " preexec_fn=processes.die_with_parent)\n"
            "print(c.pid, flush=True)\n"
            "time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child = psutil.Process(int(parent.stdout.readline()))
    _ended(parent)
    child.wait(timeout=30)   # psutil.TimeoutExpired if it outlived its parent
    assert not processes.alive(child)


def test_the_keeper_as_a_script_loads_no_ddplab_package_and_no_torch():
    """`python -X importtime` names every module a process imports: the keeper's own start."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-P", keeper.__file__, "--", sys.executable, "-c", ""],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = {ln.rsplit("|", 1)[1].strip() for ln in done.stderr.splitlines() if ln.startswith("import time:")}
    assert "psutil" in loaded   # the keeper kills through psutil: the list is the keeper's
    heavy = sorted(m for m in loaded if m.split(".")[0] in ("ddplab", "torch", "pandas", "numpy"))
    assert heavy == [], f"the keeper imported {heavy}"


def test_the_processes_module_imports_nothing_of_ddplab():
    """The keeper loads `processes.py` by its path: an import of the ddplab package there would break it."""
    source = Path(processes.__file__).read_text()
    assert "from ." not in source and "import ddplab" not in source and "from ddplab" not in source
