"""How much does ddplab add to a bare torchrun of the same work?

    python bench/launch_overhead.py [--rounds 5] [--world-size 4]

Alternates `ddplab.run` of a trivial experiment (the 2-layer token MLP, one step, one example per
rank) with a bare `torchrun` of bench/bare_ddp_step.py (the same DDP step, nothing from ddplab),
round after round, and prints the median wall time of each, their ratio (target: at most 1.15x),
and where ddplab's time went, from the ranks' own progress logs.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import ddplab
from ddplab import rundir
from ddplab.launch.torchrun import torchrun_argv, worker_env

BARE = Path(__file__).with_name("bare_ddp_step.py")


def time_ddplab(exp, out: Path) -> float:
    t0 = time.perf_counter()
    ddplab.run(exp, out, progress=False)
    return time.perf_counter() - t0


def time_bare(world_size: int) -> float:
    argv = torchrun_argv(world_size, [], script=BARE)
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, env=worker_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def breakdown(run_dir: Path, world_size: int, launch_start: float, wall: float) -> dict:
    """Seconds from launch to the ranks' first record, DDP construction to first forward, and so on."""
    first = {r: rundir.read_progress(run_dir, r) for r in range(world_size)}
    t = lambda phase: max(next(x["t_ns"] for x in recs if x["phase"] == phase) for recs in first.values()) / 1e9
    return {"torchrun + import torch (to init)": t("init-process-group") - launch_start,
            "init_process_group": t("ddp-construct") - t("init-process-group"),
            "DDP() construction (lazy torch._dynamo import)": t("forward") - t("ddp-construct"),
            "one step": t("teardown") - t("forward"),
            "teardown + torchrun exit + loading results": launch_start + wall - t("teardown")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--world-size", type=int, default=4)
    args = p.parse_args()
    exp = ddplab.Experiment(name="overhead", model="mlp", world_size=args.world_size, local_batch=1, seq_len=4)
    ours, bare, parts = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        # warm both paths once, untimed: the file cache, and torch imported in this (parent) process,
        # as it is in any notebook that has already launched a run
        time_bare(args.world_size)
        time_ddplab(exp, Path(tmp) / "warm-up")
        for i in range(args.rounds):
            for kind in ("bare", "ddplab") if i % 2 == 0 else ("ddplab", "bare"):
                if kind == "bare":
                    bare.append(time_bare(args.world_size))
                else:
                    start = time.time()
                    ours.append(time_ddplab(exp, Path(tmp) / f"r{i}"))
                    parts.append(breakdown(Path(tmp) / f"r{i}", args.world_size, start, ours[-1]))
            print(f"round {i}: ddplab {ours[-1]:.2f} s, bare torchrun {bare[-1]:.2f} s, ratio {ours[-1] / bare[-1]:.3f}")
    med_o, med_b = statistics.median(ours), statistics.median(bare)
    print(f"\n{args.world_size} ranks, {args.rounds} alternating rounds")
    print(f"ddplab.run     median {med_o:.2f} s  (min {min(ours):.2f}, max {max(ours):.2f})")
    print(f"bare torchrun  median {med_b:.2f} s  (min {min(bare):.2f}, max {max(bare):.2f})")
    print(f"ratio of medians {med_o / med_b:.3f}  (target <= 1.15); per-round ratios median "
          f"{statistics.median(o / b for o, b in zip(ours, bare)):.3f}")
    print("\nwhere ddplab's time goes (median over rounds):")
    for key in parts[0]:
        print(f"  {statistics.median(p[key] for p in parts):6.2f} s  {key}")


if __name__ == "__main__":
    main()
