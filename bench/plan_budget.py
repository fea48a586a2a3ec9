"""The planner's budget: one plan of a 7 B model (Llama-2-7B's config, sequence 2,048, one example a rank)
at 8, 64 and 1,024 ranks under FSDP2, each in at most 30 s on this machine, with the planner process's
resident memory at most 4 GiB. Prints each plan's time and peak RSS, and whether the target is met.

    python bench/plan_budget.py [--world-sizes 8,64,1024] [--strategies fsdp2,ddp]
"""

from __future__ import annotations

import argparse
import resource
import time

import ddplab

TIME_S, RSS_GIB = 30.0, 4.0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world-sizes", default="8,64,1024")
    ap.add_argument("--strategies", default="fsdp2")
    args = ap.parse_args()
    ok = True
    for s in args.strategies.split(","):
        for w in map(int, args.world_sizes.split(",")):
            t0 = time.perf_counter()
            p = ddplab.plan(model="hf:llama-2-7b", world_size=w, strategy=s, seq_len=2048, local_batch=1,
                            timeout_s=600)
            wall = time.perf_counter() - t0
            # the planner is this process's child, gone now: its peak RSS is the children's maximum so far
            rss_gib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20
            met = wall <= TIME_S and rss_gib <= RSS_GIB
            ok &= met
            print(f"{s} at {w} ranks: {wall:.1f} s (planner: {p.seconds}), children's max RSS {rss_gib:.2f} GiB, "
                  f"peak {p.peak_bytes / 2**30:.1f} GiB in {p.peak_phase}: target "
                  f"{'met' if met else 'NOT met'} (<= {TIME_S:g} s, <= {RSS_GIB:g} GiB)")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
