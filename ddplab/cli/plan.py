"""`ddplab plan`: a model at a cluster's world sizes, planned on this machine (launch/plan.py).

    ddplab plan --model hf:llama-2-7b --world-sizes 8,64,1024 --strategies fsdp2 --seq-len 2048 --local-batch 1
    ddplab plan --model mypkg.models:build --world-sizes 8,64 --device-gib 80
"""

from __future__ import annotations

import sys

from ..predict.plan import CLUSTERS
from ..spec.plan import HF_CONFIGS, PLAN_DTYPES, PLAN_OPTIMIZERS, STRATEGIES


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"--world-sizes: expected whole numbers separated by commas, got {text!r}") from None


def add_plan_flags(p) -> None:
    p.add_argument("--model", default="transformer", help=f"transformer, mlp, package.module:factory, hf:NAME "
                                                          f"({', '.join(HF_CONFIGS)}) or hf:PATH/config.json")
    p.add_argument("--world-sizes", default="8,64,1024", help="ranks, comma-separated (default 8,64,1024)")
    p.add_argument("--strategies", default=",".join(STRATEGIES), help=f"comma-separated, of {', '.join(STRATEGIES)}")
    p.add_argument("--local-batch", type=int, default=8, help="examples per rank per step")
    p.add_argument("--seq-len", type=int, default=16, help="tokens per example")
    p.add_argument("--dtype", default="float32", choices=PLAN_DTYPES)
    p.add_argument("--optimizer", default="adamw", choices=PLAN_OPTIMIZERS)
    p.add_argument("--checkpointing", action="store_true", help="recompute each layer's activations in backward")
    p.add_argument("--keep-gathered", action="store_true", help="fsdp2: reshard_after_forward=False")
    p.add_argument("--first-step", action="store_true", help="plan the step that creates the optimizer state")
    for name, default in (("vocab-size", 64), ("d-model", 64), ("n-layers", 2), ("n-heads", 4)):
        p.add_argument(f"--{name}", type=int, default=default, help="built-in models and factories")
    p.add_argument("--device-gib", type=float, default=None, help="say whether each peak fits a device this large")
    p.add_argument("--cluster", default="h100-ib", choices=sorted(CLUSTERS),
                   help="estimate each step's time on this cluster's published figures (an estimate)")
    p.add_argument("--timeout-s", type=float, default=300.0, help="seconds one plan may take")


def cmd_plan(args) -> int:
    from ..launch.plan import plan_all
    from ..spec.plan import PlanSpec
    from ..tables.plan import corrections, estimate_table, plans_table

    try:
        base = PlanSpec(model=args.model, local_batch=args.local_batch, seq_len=args.seq_len, dtype=args.dtype,
                        optimizer=args.optimizer, checkpointing=args.checkpointing, first_step=args.first_step,
                        vocab_size=args.vocab_size, d_model=args.d_model, n_layers=args.n_layers,
                        n_heads=args.n_heads, timeout_s=args.timeout_s)
        specs = [base.replace(world_size=w, strategy=s,
                              reshard_after_forward=not (args.keep_gathered and s == "fsdp2"))
                 for w in _ints(args.world_sizes) for s in args.strategies.split(",")]
    except ValueError as e:
        print(f"ddplab plan: {e}", file=sys.stderr)
        return 2
    def arrived(p):   # a line as each plan arrives: a 7 B plan takes ten seconds or more
        print(f"planned {p.spec.strategy} at {p.spec.world_size} ranks in {sum(p.seconds.values()):.1f} s",
              file=sys.stderr)
    from ..launch.plan import PlanFailed

    try:
        plans = plan_all(specs, arrived)
    except ValueError as e:
        print(f"ddplab plan: {e}", file=sys.stderr)
        return 2
    except (PlanFailed, TimeoutError) as e:
        print(f"ddplab plan FAILED\n{e}", file=sys.stderr)
        return 1
    import pandas as pd

    with pd.option_context("display.width", 200, "display.max_columns", 30, "display.precision", 3):
        print(plans_table(plans, args.device_gib).to_string(index=False))
    print(f"\n{plans[0].record.parameters_total:,} parameters. Sources: memory from torch's "
          f"{'/'.join(sorted({p.record.peak_source for p in plans}))} on a fake process group; DDP's buckets "
          f"from DDP; optimizer state cross-checked with optimizer.state; collectives as dispatched; FLOPs "
          f"from FlopCounterMode.")
    for line in corrections(plans):
        print(line)
    estimates, assumptions = estimate_table([p for p in plans if not p.record.untraced], args.cluster)
    if len(estimates):
        print(f"\nStep time on {args.cluster}, an ESTIMATE from published figures, not a measurement:")
        print(estimates.to_string(index=False))
        print("\n".join(f"  {a}" for a in assumptions))
    return 0
