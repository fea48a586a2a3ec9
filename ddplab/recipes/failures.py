"""Notebook 08, failures provoked on purpose: one experiment per way a data-parallel job breaks, and
the price of DDP's find_unused_parameters."""

from __future__ import annotations

from ..spec import Experiment, Fault

# (faulty rank, step) per fault kind on 2 ranks: rank 0 issues the extra all-reduce (the issue's
# example); the shape mismatch is built before step 0; the unused parameter shows one step later
FAILURE_MODEL = dict(world_size=2, local_batch=4, seq_len=16, steps=3)
WHERE = {"crash": (1, 1), "skip-backward": (1, 1), "stall": (1, 1), "extra-all-reduce": (0, 1),
         "shape-mismatch": (1, 0), "unused-parameter": (1, 0), "sigkill": (1, 1)}


def fault_runs(kinds=("skip-backward", "extra-all-reduce", "shape-mismatch", "unused-parameter", "sigkill"),
                timeout_s: float = 3,
                **overrides) -> dict[str, Experiment]:
    """One experiment per fault kind, each failing on its own rank, with a short collective timeout."""
    out = {}
    for kind in kinds:
        rank, step = WHERE[kind]
        out[kind] = Experiment(name=f"fail-{kind}", fault=Fault(kind, rank=rank, step=step), timeout_s=timeout_s,
                               **{**FAILURE_MODEL, **overrides})
    return out


def unused_parameter_fixes(**overrides) -> dict[str, Experiment]:
    """The unused-parameter fault with torch's INFO debug level (DDP's error names the parameters),
    and with find_unused_parameters=True (DDP reduces the rank's missing gradients as zeros: it runs)."""
    rank, step = WHERE["unused-parameter"]
    base = dict(fault=Fault("unused-parameter", rank=rank, step=step), timeout_s=5, **{**FAILURE_MODEL, **overrides})
    return {"info": Experiment(name="fail-unused-info", distributed_debug="info", **base),
            "find-unused": Experiment(name="unused-found", find_unused_parameters=True, **base)}


def find_unused_cost(steps: int = 12, **overrides) -> list[Experiment]:
    """The same healthy DDP run with find_unused_parameters off and on: the graph walk it adds to every
    step, and the bucket rebuild it prevents (docs/ddp-internals.md, "The bucket rebuild")."""
    base = dict(world_size=2, local_batch=8, seq_len=32, d_model=64, steps=steps, bucket_cap_mb=0.05,
                probes=("buckets",))
    base.update(overrides)
    return [Experiment(name="find-unused-off", **base), Experiment(name="find-unused-on", find_unused_parameters=True,
                                                                    **base)]
