"""Notebook 12, from this laptop to a cluster: the real runs a plan is checked against, and the plans.

A plan (`ddplab.plan`) runs one step as rank 0 of a fake process group; `real_runs` are the same step on
real gloo ranks, one per strategy in one launch, and `plan_spec` turns one of them into the PlanSpec of the
same step, so the two can be set side by side (`tables.plan.side_by_side`).
"""

from __future__ import annotations

from ..spec import Experiment
from ..spec.plan import PlanSpec

SHARDING_OF = {"ddp": "none", "zero1": "zero1", "fsdp2": "fsdp2"}
MODEL = dict(model="transformer", d_model=64, n_layers=2, n_heads=4, vocab_size=64, seq_len=16)
SEVEN_B = dict(model="hf:llama-2-7b", seq_len=2048, local_batch=1)


def real_runs(world_size: int = 4, local_batch: int = 8, **overrides) -> list[Experiment]:
    """The lab's transformer under DDP, ZeRO-1 and FSDP2 on real ranks, two AdamW steps each, with the memory
    probe (and DDP's buckets, several of them), to set beside their plans."""
    exps = []
    for strategy, sharding in SHARDING_OF.items():
        ddp = sharding != "fsdp2"
        fields = dict(name=f"at-scale-{strategy}-w{world_size}", world_size=world_size, local_batch=local_batch,
                      sharding=sharding, optimizer="adamw", steps=2, probes=("memory",) + (("buckets",) if ddp else ()),
                      **({"bucket_cap_mb": 0.05} if ddp else {}), **MODEL)
        fields.update(overrides)
        exps.append(Experiment(**fields))
    return exps


def plan_spec(exp: Experiment, **overrides) -> PlanSpec:
    """The plan of the step `exp` runs: the same model, ranks, batch, optimizer and buckets."""
    strategy = {v: k for k, v in SHARDING_OF.items()}[exp.sharding]
    unplanned = {"dtype": "float32", "momentum": 0.0, "gradient_as_bucket_view": False, "find_unused_parameters": False,
                 "accum_steps": 1, "sync": "ddp"}
    for name, default in unplanned.items():
        if getattr(exp, name) != default:
            raise ValueError(f"Experiment.{name}: a plan does not model {name}={getattr(exp, name)!r} (only {default!r})")
    fields = dict(model=exp.model, vocab_size=exp.vocab_size, d_model=exp.d_model, n_layers=exp.n_layers,
                  n_heads=exp.n_heads, tie_weights=exp.tie_weights, world_size=exp.world_size, strategy=strategy,
                  local_batch=exp.local_batch_of(0), seq_len=exp.seq_len_of(0), optimizer=exp.optimizer,
                  checkpointing=exp.checkpointing, bucket_cap_mb=exp.bucket_cap_mb if strategy != "fsdp2" else None)
    fields.update(overrides)
    return PlanSpec(**fields)
