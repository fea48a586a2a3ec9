"""What a killed launcher or a session leaves on disk is deleted once it is provably dead, and nothing
else: a staging directory or a session directory whose owning process is gone and that no
live process names. Unclaimed directories, live owners and other hosts' directories stay."""

from __future__ import annotations

import json
import subprocess
import sys

import ddplab
from ddplab import processes, rundir
from ddplab.launch.torchrun import sweep_dead


def _dead_owner(directory):
    """Claim `directory` for a process that has exited (its pid and identity, as `claim` records them)."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    identity = processes.identity(p.pid)
    p.wait()
    directory.mkdir(parents=True, exist_ok=True)
    (directory / rundir.OWNER).write_text(json.dumps({"pid": p.pid, "host": __import__("socket").gethostname(),
                                                      **identity}))


def test_only_provably_dead_directories_are_swept(tmp_path):
    dead, live, unclaimed, damaged = (tmp_path / f".r.{n}.partial" for n in ("dead", "live", "none", "bad"))
    _dead_owner(dead)
    live.mkdir()
    rundir.claim(live)
    unclaimed.mkdir()
    damaged.mkdir()
    (damaged / rundir.OWNER).write_text("{")
    other_host = tmp_path / ".r.other.partial"
    _dead_owner(other_host)
    d = json.loads((other_host / rundir.OWNER).read_text())
    (other_host / rundir.OWNER).write_text(json.dumps({**d, "host": "another-node"}))
    assert rundir.owner_gone(dead) and not rundir.owner_gone(live)
    recycled = tmp_path / "recycled"   # its pid now belongs to a live process started at another time
    recycled.mkdir()
    (recycled / rundir.OWNER).write_text(json.dumps({**json.loads((dead / rundir.OWNER).read_text()),
                                                     "pid": __import__("os").getpid()}))
    assert rundir.owner_gone(recycled)
    assert sweep_dead(tmp_path, ".*.partial") == [dead]
    assert {p.name for p in tmp_path.iterdir()} == {live.name, unclaimed.name, damaged.name, other_host.name,
                                                    recycled.name}


def test_a_launch_sweeps_a_killed_launchers_staging_directory_and_leaves_its_own_settled(tmp_path):
    left = tmp_path / ".old-run.0123456789ab.partial"
    _dead_owner(left)
    run = ddplab.run(ddplab.Experiment(world_size=2, local_batch=2, seq_len=8, steps=1), tmp_path / "r",
                     progress=False, warm=False)
    assert not left.exists()
    assert not (run.path / rundir.OWNER).exists()   # a settled run is no staging directory
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".partial")] == []


def test_a_closed_session_removes_its_directory_and_a_dead_ones_is_swept(tmp_path):
    stale = tmp_path / ".sessions" / "deadbeef0000"
    _dead_owner(stale)
    with ddplab.Session(world_size=2, runs_dir=tmp_path) as s:
        assert not stale.exists() and (s.dir / rundir.OWNER).exists()
    assert not s.dir.exists()
