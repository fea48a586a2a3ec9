"""What do the readiness and bucket probes cost a DDP step?

    python bench/instrumentation_overhead.py [--rounds 30] [--steps 2] [--caps 1 default]

One launch, paired A/B over many short rounds (the machine drifts within seconds): for each cap,
torch DDP with its own C++ all-reduce and no probe ("bare") and the same DDP with the readiness probe
(a post-accumulate-grad hook per parameter) and the bucket probe (a Python comm hook timestamping
every bucket) ("ddp"), run back to back in every round. Per round the ratio of the two medians is one
paired sample; prints every round's overhead and
the median over rounds against the target (at most 2%).
"""

from __future__ import annotations

import argparse
import statistics

import ddplab
import dataclasses

from ddplab import recipes
from ddplab.tables import bucket_sweep


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--caps", nargs="+", default=["1", "default"], help="bucket caps in MiB, or 'default'")
    args = p.parse_args()
    plans = tuple(f"{kind}:{c}" for c in args.caps for kind in ("bare", "ddp"))
    _, sweep = recipes.bucket_sweep(rounds=args.rounds, steps=args.steps)
    run = ddplab.run(sweep.replace(name="bench-probe-overhead", task=dataclasses.replace(sweep.task, plans=plans)),
                     progress=True)
    overall = []
    for c in args.caps:
        per_round = []
        for r in range(args.rounds):
            med = {kind: statistics.median(bucket_sweep.step_times(run, f"{kind}:{c}")[r]) for kind in ("bare", "ddp")}
            per_round.append(med["ddp"] / med["bare"] - 1)
        overall += per_round
        m = statistics.median(per_round)
        q = statistics.quantiles(per_round, n=4)
        print(f"cap {c:>7}: per round " + " ".join(f"{v:+.1%}" for v in per_round))
        print(f"cap {c:>7}: median {m:+.1%} (quartiles {q[0]:+.1%} .. {q[2]:+.1%}); target at most 2%: "
              f"{'met' if m <= 0.02 else 'NOT met'}\n")
    print(f"all caps together, median over {len(overall)} paired rounds: {statistics.median(overall):+.1%}")


if __name__ == "__main__":
    main()
