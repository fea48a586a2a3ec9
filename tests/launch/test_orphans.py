"""No orphans, whenever the launcher dies or is interrupted: ranks arm their
parent-death signal before `import torch`, and a second Ctrl-C cannot cut the cleanup short."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.support import ctrl_c_reaches_it, leftovers

pytestmark = pytest.mark.slow

LAUNCHER = textwrap.dedent("""
    import os, time
    import ddplab
    exp = ddplab.Experiment(name="long", world_size=2, steps=10_000, local_batch=8, timeout_s=60)
    try:
        ddplab.run(exp, os.environ["RUN_DIR"], progress=False)
    except KeyboardInterrupt as e:
        print(f"caught {type(e).__name__}: {e}", flush=True)
        time.sleep(60)   # like a notebook kernel: the launcher's process lives on after Ctrl-C
""")


def _launcher(run_dir) -> subprocess.Popen:
    # the run directory travels in the environment, so only torchrun and the ranks name it on their command line
    return subprocess.Popen([sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "RUN_DIR": str(run_dir)}, preexec_fn=ctrl_c_reaches_it)


def _wait_for_no_leftovers(run_dir, within_s: float) -> list[str]:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        left = leftovers(run_dir)
        if not left:
            return []
        time.sleep(0.2)
    return leftovers(run_dir)


@pytest.mark.parametrize("after_s", [0.2, 0.5, 1.0, 1.5, 3.0])
def test_killing_the_launcher_during_start_up_leaves_no_rank_alive(tmp_path, after_s):
    run_dir = tmp_path / f"killed-{after_s}"
    launcher = _launcher(run_dir)
    time.sleep(after_s)
    launcher.kill()
    launcher.wait()
    left = _wait_for_no_leftovers(run_dir, within_s=5)
    assert left == [], f"killed {after_s} s after spawn, still alive after 5 s: {left}"


def test_a_second_ctrl_c_during_cleanup_still_kills_every_rank(tmp_path):
    run_dir = tmp_path / "interrupted"
    launcher = _launcher(run_dir)
    try:
        deadline = time.monotonic() + 60
        staged = lambda: list(run_dir.parent.glob(f".{run_dir.name}.*.partial/rank1.progress"))  # noqa: E731
        while not staged() or "forward" not in staged()[0].read_text():
            assert time.monotonic() < deadline, "the ranks never started"
            time.sleep(0.1)
        launcher.send_signal(signal.SIGINT)
        time.sleep(0.005)
        launcher.send_signal(signal.SIGINT)
        said = launcher.stdout.readline().strip()
        assert said.startswith("caught Interrupted: interrupted: 2 ranks stopped after "), said
        assert launcher.poll() is None   # the launcher's process lives on, as a kernel would
        assert _wait_for_no_leftovers(run_dir, within_s=2) == []
    finally:
        launcher.kill()
        launcher.wait()
