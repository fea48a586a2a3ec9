"""A rank checks, before it imports torch, that its parent is still torchrun's agent (`processes.parent_is_torchrun`):
the keeper above torchrun names the agent's command after its own `--`, and is not the agent."""

from __future__ import annotations

import subprocess
import sys

CHILD = "from ddplab import processes; print(processes.parent_is_torchrun())"
# the parent starts the child, waits for it and passes on what it printed; its own arguments follow the code
PARENT = f"import subprocess, sys; sys.stdout.write(subprocess.run([sys.executable, '-c', {CHILD!r}], capture_output=True, text=True).stdout)"


def _under(*parent_args: str) -> str:
    return subprocess.run([sys.executable, "-c", PARENT, *parent_args], capture_output=True, text=True,
                          timeout=120).stdout.strip()


def test_the_agent_is_a_parent_and_the_keeper_above_it_is_not():
    assert _under("-m", "ddplab.launch.loopback", "--nnodes=1") == "True"   # the agent's own module
    assert _under("-m", "torch.distributed.run") == "True"
    # the keeper's command line carries the agent's after `--`: that is not the program it runs
    assert _under("--owner", "1", "--", sys.executable, "-m", "ddplab.launch.loopback") == "False"
    assert _under("something-else") == "False"
