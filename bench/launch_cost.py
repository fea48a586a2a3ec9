"""What one launch costs in CPU-seconds, and how much of it is starting processes.

    python bench/launch_cost.py [--rounds 3] [--steps 2]

The suite is CPU-bound on a 2-core machine, so what a test costs is the CPU its processes use, and a
test that starts ranks pays for their start whatever they then run. This measures, in rounds, on this
machine:
- a cold launch (`ddplab.run(..., warm=False)`) of a small experiment on 2 and on 4 ranks: the CPU of
  every process it started (torchrun's agent, the keeper, the ranks; from this process's rusage of its
  reaped children) and of the launcher itself;
- the start-up alone: one fresh interpreter doing what a rank does before its first step
  (`host.import_torch_frozen("torch._dynamo")`), and one doing what torchrun's agent does
  (`host.import_torch_frozen()`);
- the same experiment as a job for warm ranks (`ddplab.Session`), which pays the start once.
A session's ranks outlive the job, so a warm job's CPU is read from the live processes under this one
(psutil) before and after it. It prints the medians, the share of a cold launch that is process start-up
(ranks x a rank's start + an agent's start), and whether the target is met: a warm job costs at most
0.25x the CPU of a cold launch of the same experiment.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET = 0.25
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

    rank_start, agent_start, cold, warm = [], [], {2: [], 4: []}, {2: [], 4: []}
    measured(lambda: ddplab.run(exp(2, -1, "first"), out, progress=False, warm=False))   # the launcher's own imports
    for i in range(args.rounds):
        rank_start.append(measured(lambda: subprocess.run([sys.executable, "-c", RANK_START], check=True)))
        agent_start.append(measured(lambda: subprocess.run([sys.executable, "-c", AGENT_START], check=True)))
        for ws in (2, 4):
            cold[ws].append(measured(lambda: ddplab.run(exp(ws, i, "cold"), out, progress=False, warm=False)))
    for ws in (2, 4):
        with ddplab.Session(world_size=ws):
            ddplab.run(exp(ws, -1, "warm-first"), out, progress=False)   # the session's start, not counted
            for i in range(args.rounds):
                warm[ws].append(measured(lambda: ddplab.run(exp(ws, i, "warm"), out, progress=False)))
    rank, agent = statistics.median(rank_start), statistics.median(agent_start)
    print(f"a rank's start {rank:.2f} CPU-s, an agent's {agent:.2f} (medians of {args.rounds})")
    met = True
    for ws in (2, 4):
        c, w = statistics.median(cold[ws]), statistics.median(warm[ws])
        share = min(1.0, (ws * rank + agent) / c)   # both are medians of noisy readings
        met &= w / c <= TARGET
        print(f"{ws} ranks, {args.steps} steps: cold launch {c:.2f} CPU-s, of which starting {ws} ranks and the agent "
              f"about {share:.0%}; a warm job {w:.2f} CPU-s = {w / c:.2f}x the cold launch")
    print(f"target (a warm job at most {TARGET}x a cold launch): {'met' if met else 'NOT met'}")


if __name__ == "__main__":
    main()
