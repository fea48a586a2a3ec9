"""How much does a warm session save, and what does a warm run still cost beyond its own step?

    python bench/session_latency.py [--rounds 7] [--world-size 2]

Runs the same 1-step experiment (the token MLP, one example per rank) cold (`ddplab.run` with no
session: torchrun, `import torch`, the process group, DDP's lazy imports) and warm (a job for a
`ddplab.Session` of the same size), interleaved round after round, and prints the median wall time
of each, their ratio, and the warm overhead: warm wall time minus the step's own time on the ranks
(the slowest rank's task, from its start to its record written); then times a `%%ddp` cell
that prints the rank (`Session.execute`, what the magic calls). Targets (issue 12, on a 2-core
machine): overhead at most 0.1 s on 2 ranks and 0.25 s on 4; the print cell at most 0.1 s on 2 ranks.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import ddplab

TARGET_S = {2: 0.10, 4: 0.25}
CELL_TARGET_S = {2: 0.10}


def timed(exp, out: Path) -> tuple[float, float]:
    """(wall seconds of `ddplab.run`, seconds of the task itself: the slowest rank's envelope, from
    its task's start to its record written, excluding process groups and clean-up)."""
    t0 = time.perf_counter()
    run = ddplab.run(exp, out, progress=False)
    wall = time.perf_counter() - t0
    return wall, max((r.envelope.t_end_ns - r.envelope.t_start_ns) / 1e9 for r in run.ranks)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--world-size", type=int, default=2)
    args = p.parse_args()
    exp = ddplab.Experiment(name="latency", model="mlp", world_size=args.world_size, local_batch=1, seq_len=4)
    cold, warm, overhead = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        ddplab.run(exp, tmp / "cold-warm-up", progress=False)   # the file cache, and torch in this process
        session = ddplab.Session(world_size=args.world_size, runs_dir=tmp / "runs")
        try:
            ddplab.run(exp.replace(seed=1), tmp / "warm-up", progress=False)   # DDP's lazy imports, once
            for i in range(args.rounds):
                e = exp.replace(seed=100 + i)
                order = ("cold", "warm") if i % 2 == 0 else ("warm", "cold")
                for kind in order:
                    if kind == "cold":
                        session.close()
                        cold.append(timed(e, tmp / f"cold{i}")[0])
                        session = ddplab.Session(world_size=args.world_size, runs_dir=tmp / "runs")
                        ddplab.run(exp.replace(seed=2 + i), tmp / f"rewarm{i}", progress=False)
                    else:
                        wall, ranks_s = timed(e, tmp / f"warm{i}")
                        warm.append(wall)
                        overhead.append(wall - ranks_s)
                print(f"round {i}: cold {cold[-1]:.2f} s, warm {warm[-1] * 1e3:.0f} ms "
                      f"(of which the ranks' own {1e3 * (warm[-1] - overhead[-1]):.0f} ms)")
            cell = []
            for _ in range(20):
                t0 = time.perf_counter()
                session.execute("print(rank)")
                cell.append(time.perf_counter() - t0)
        finally:
            session.close()
    med_c, med_w, med_o = statistics.median(cold), statistics.median(warm), statistics.median(overhead)
    target = TARGET_S.get(args.world_size)
    print(f"\n{args.world_size} ranks, {args.rounds} interleaved rounds, the same 1-step experiment")
    print(f"cold ddplab.run   median {med_c:.2f} s  (min {min(cold):.2f}, max {max(cold):.2f})")
    print(f"warm (a session)  median {med_w * 1e3:.0f} ms  (min {min(warm) * 1e3:.0f}, max {max(warm) * 1e3:.0f})")
    print(f"cold / warm       {med_c / med_w:.0f}x")
    verdict = "" if target is None else f"  (target <= {target:.2f} s: {'met' if med_o <= target else 'NOT met'})"
    print(f"warm overhead     median {med_o * 1e3:.0f} ms beyond the ranks' own time{verdict}")
    med_cell, cell_target = statistics.median(cell), CELL_TARGET_S.get(args.world_size)
    verdict = "" if cell_target is None else \
        f"  (target <= {cell_target:.2f} s: {'met' if med_cell <= cell_target else 'NOT met'})"
    print(f"%%ddp print cell  median {med_cell * 1e3:.1f} ms over {len(cell)}{verdict}")


if __name__ == "__main__":
    main()
