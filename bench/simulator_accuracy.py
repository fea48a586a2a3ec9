"""How well does the bucket simulator predict a measured bucket sweep on this machine?

    python bench/simulator_accuracy.py [--world-size 2] [--rounds 7] [--steps 4] [--no-pin]

One launch: an all-reduce sweep (alpha-beta fit) and a bucket sweep (DDP at caps from one tensor per
bucket to a single bucket, DDP's default, and an explicit plan with its last bucket split). Prints,
per plan, the measured step time (median over rounds, run-to-run spread) beside the three models'
predictions; then each model's mean and max absolute error over the caps (the calibrated model
without its calibration point), the ordering check (pairs that
`claims` resolves on the paired steps must come out in the same order; the rest are ties), and the target: mean <= 5% and
max <= 10% on 2 ranks (max <= 12% on 4). Timing targets live here, not in the tests.
"""

from __future__ import annotations

import argparse
import time

import pandas as pd

import ddplab
from ddplab import recipes, tables
from ddplab.tables import bucket_sweep, buckets


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--no-pin", action="store_true", help="do not pin ranks to cores")
    args = p.parse_args()
    t0 = time.monotonic()
    ar, bs = ddplab.run_many(recipes.bucket_sweep(args.world_size, rounds=args.rounds, steps=args.steps,
                                                  pin_cpus=not args.no_pin), name="bench-simulator")
    wall = time.monotonic() - t0
    link, q = tables.fit_sweep(tables.allreduce_sweep(ar))
    sweep = [name for name in bucket_sweep.arm_names(bs) if name.startswith("ddp:")]
    calibrated_on = buckets.calibration_plan({p: buckets.plan_for(bs, p) for p in sweep})
    extra, costs = buckets.compare(bs, link, calibrated_on)  # every plan, the explicit ones included
    table = extra.loc[sweep]                                 # graded: the DDP caps
    pd.set_option("display.width", 200)
    cols = ["buckets", "measured_ms", "spread_ms", "textbook_ms", "textbook_error", "shared_core_ms",
            "shared_core_error", "calibrated_ms", "calibrated_error"]
    print(f"{args.world_size} ranks, launch {wall:.0f} s; alpha-beta fit: alpha {link.alpha_s * 1e3:.2f} ms, "
          f"{link.bandwidth_bytes_per_s / 1e9:.2f} GB/s (median error {q.median_rel_error:.1%}); calibrated "
          f"alpha in flight {costs['calibrated'].link.alpha_s * 1e3:.2f} ms (on {calibrated_on}); copies at "
          f"{costs['shared_core'].copy_bytes_per_s / 1e9:.1f} GB/s\n")
    print(extra[cols].round(3).to_string(), "\n")
    per_step = bucket_sweep.steps(bs)   # step i of every plan in the same round: paired
    costs_time = bucket_sweep.judge_costs(per_step)
    judge = not any(v.contradicted for v in costs_time.values())   # no plan measured faster than no communication
    print(f"can this sweep judge timing? synchronizing is judged to cost time for {sum(v.holds for v in costs_time.values())} "
          f"of {len(costs_time)} plans, contradicted for {sum(v.contradicted for v in costs_time.values())}\n")
    for model in buckets.MODELS:
        e = buckets.error_summary(table, f"{model}_error", include_calibration=model != "calibrated")
        print(f"{model:12s} mean |error| {e['mean_abs_error']:6.1%}  max {e['max_abs_error']:6.1%}  (worst {e['worst']})")
    order = buckets.ordering(table, per_step)
    resolved = order[order["verdict"] == "ordered"]
    agree = int(resolved["agrees"].sum())
    print(f"\nordering: {len(resolved)} of {len(order)} pairs resolved (on the paired steps), "
          f"{agree} ordered as measured; {len(order) - len(resolved)} ties")
    for _, r in resolved[resolved["agrees"].eq(False)].iterrows():
        print(f"  disagrees: {r['a']} vs {r['b']}: measured {r['measured_diff_ms']:+.1f} ms, "
              f"predicted {r['predicted_diff_ms']:+.1f} ms")
    e = buckets.error_summary(table)
    limit = 0.10 if args.world_size == 2 else 0.12
    ok = judge and e["mean_abs_error"] <= 0.05 and e["max_abs_error"] <= limit and agree == len(resolved)
    print(f"\ntarget (calibrated: mean <= 5%, max <= {limit:.0%}, every resolved pair ordered): "
          f"{'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    main()
