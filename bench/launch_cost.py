"""What one launch costs in CPU-seconds, and how much of it is starting processes.

    python bench/launch_cost.py [--rounds 3] [--steps 2]

The suite is CPU-bound on a 2-core machine, so what a test costs is the CPU its processes use, and a
test that starts ranks pays for their start whatever they then run. This measures, in rounds, on this
machine:
- a cold launch (`ddplab.run(..., warm=False)`) of a small experiment on 2 and on 4 ranks: the CPU of
  every process it started (torchrun's agent, the keeper, the ranks; from this process's rusage of its
  reaped children) and of the launcher itself, with the ranks forked from torchrun's agent (the default
  on a machine without a GPU, `launch.loopback.fork_rank`) and with each rank a new interpreter
  ($DDPLAB_RANK_START=exec, as torchrun starts a script), alternating in each round;
- the start-up alone: one fresh interpreter doing what a rank does before its first step
  (`host.import_torch_frozen("torch._dynamo")`), and one doing what torchrun's agent does
  (`host.import_torch_frozen()`);
- the same experiment as a job for warm ranks (`ddplab.Session`), which pays the start once.
A session's ranks outlive the job, so a warm job's CPU is read from the live processes under this one
(psutil) before and after it. It prints the medians, the share of a cold launch that is process start-up
(ranks x a rank's start + an agent's start) of an exec'd launch, and whether the targets are met: a
warm job costs at most 0.25x the CPU of a cold launch of the same experiment, and a forked cold launch at
most 0.5x an exec'd one.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET = 0.25        # a warm job / a cold launch
FORK_TARGET = 0.5    # a cold launch with forked ranks / one with exec'd ranks
RANK_START = "from ddplab.host import import_torch_frozen\nimport_torch_frozen('torch._dynamo')\n"
AGENT_START = "from ddplab.host import import_torch_frozen\nimport_torch_frozen()\n"


def cpu() -> float:
    """This process, its reaped children, and every live process under it (a session's ranks)."""
    import psutil

    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    live = 0.0
    for p in psutil.Process().children(recursive=True):
        try:
            t = p.cpu_times()
            live += t.user + t.system
        except psutil.Error:
            pass
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime + live


def measured(fn) -> float:
    before = cpu()
    fn()
    return cpu() - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    import ddplab

    out = Path(tempfile.mkdtemp(prefix="launch-cost-"))

    def exp(ws, i, kind):
        return ddplab.Experiment(name=f"{kind}-w{ws}-{i}-{time.time_ns()}", world_size=ws, local_batch=4, seq_len=8,
                                 steps=args.steps)

    rank_start, agent_start, warm = [], [], {2: [], 4: []}
    cold = {(mode, ws): [] for mode in ("fork", "exec") for ws in (2, 4)}

    def cold_launch(mode, ws, i):
        os.environ["DDPLAB_RANK_START"] = mode   # read by torchrun's agent (launch.loopback)
        try:
            return measured(lambda: ddplab.run(exp(ws, i, f"cold-{mode}"), out, progress=False, warm=False))
        finally:
            del os.environ["DDPLAB_RANK_START"]

    measured(lambda: ddplab.run(exp(2, -1, "first"), out, progress=False, warm=False))   # the launcher's own imports
    for i in range(args.rounds):
        rank_start.append(measured(lambda: subprocess.run([sys.executable, "-c", RANK_START], check=True)))
        agent_start.append(measured(lambda: subprocess.run([sys.executable, "-c", AGENT_START], check=True)))
        for ws in (2, 4):
            for mode in (("fork", "exec") if i % 2 == 0 else ("exec", "fork")):
                cold[mode, ws].append(cold_launch(mode, ws, i))
    for ws in (2, 4):
        with ddplab.Session(world_size=ws):
            ddplab.run(exp(ws, -1, "warm-first"), out, progress=False)   # the session's start, not counted
            for i in range(args.rounds):
                warm[ws].append(measured(lambda: ddplab.run(exp(ws, i, "warm"), out, progress=False)))
    rank, agent = statistics.median(rank_start), statistics.median(agent_start)
    print(f"a rank's start as a new interpreter {rank:.2f} CPU-s, an agent's {agent:.2f} (medians of {args.rounds})")
    met = True
    for ws in (2, 4):
        e, f, w = (statistics.median(cold["exec", ws]), statistics.median(cold["fork", ws]), statistics.median(warm[ws]))
        share = min(1.0, (ws * rank + agent) / e)   # both are medians of noisy readings
        met &= w / f <= TARGET and f / e <= FORK_TARGET
        print(f"{ws} ranks, {args.steps} steps: a cold launch with exec'd ranks {e:.2f} CPU-s (starting {ws} ranks and the "
              f"agent about {share:.0%} of it); with forked ranks {f:.2f} CPU-s = {f / e:.2f}x; "
              f"a warm job {w:.2f} CPU-s = {w / f:.2f}x the forked cold launch")
    print(f"targets (a forked cold launch at most {FORK_TARGET}x an exec'd one, a warm job at most {TARGET}x a "
          f"forked cold launch): {'met' if met else 'NOT met'}")


if __name__ == "__main__":
    main()
