"""A plan's record: what rank 0 of the fake process group held, issued and computed in one step, each
figure with the torch tool that gave it (pure: no torch). Written by `rank/planner.py`, read by
`launch/plan.py` into a `Plan`, shown by `tables/plan.py`.

Categories (bytes of this rank): parameters, buffers (a module's non-trainable state), gradients, optimizer_state, ddp_buckets (DDP's flat
buffers), comm_buffers (FSDP2's all-gather and reduce-scatter buffers), activations, temporaries.
"""

from __future__ import annotations

from dataclasses import dataclass, field

CATEGORIES = ("parameters", "buffers", "gradients", "optimizer_state", "ddp_buckets", "comm_buffers", "activations",
              "temporaries")


@dataclass(frozen=True)
class Figure:
    """One number of the plan and where it came from."""

    bytes: int
    source: str                   # the torch tool or code path that gave it ("FSDPMemTracker", "optimizer.state")


@dataclass(frozen=True)
class Collective:
    """Collectives of one kind that rank 0 issued in the planned step."""

    op: str                       # all_reduce, all_gather, reduce_scatter, broadcast
    count: int
    payload_bytes: int            # bytes of the tensors handed to the collectives, summed (rank 0's view)
    wire_bytes: int               # bytes rank 0 sends on a ring of world_size ranks (docs/at-scale.md)


@dataclass(frozen=True)
class Correction:
    """Where a torch tool disagreed with a direct count, and which figure the plan kept."""

    tool: str
    category: str
    tool_bytes: int
    kept_bytes: int
    kept_source: str
    why: str


@dataclass(frozen=True)
class PlanRecord:
    spec: dict                    # the PlanSpec, as JSON
    torch_version: str
    parameters_total: int         # elements of the whole model
    parameters_local: int         # elements rank 0 stores (a shard, under FSDP2)
    held: dict[str, Figure]       # by category, at its largest (activations: saved by the end of the forward)
    at_peak: dict[str, int]       # by category, at the moment of the peak: what makes it
    peak_bytes: int               # the most rank 0 holds at once in the step
    peak_source: str
    peak_phase: str               # forward, backward or optimizer: the tracker's phase at the peak
    held_between_steps: int       # what stays from one step to the next (parameters, state, buckets)
    collectives: list[Collective]
    buckets_bytes: list[int]      # DDP's buckets in the planned step (rebuilt in ready order after the first); []: no DDP
    layers: int                   # the units FSDP2 shards / checkpointing wraps
    flops: int                    # FlopCounterMode's count for one forward and backward of rank 0's batch
    seconds: dict[str, float]     # build, wrap, trace: where the planner's time went
    corrections: list[Correction] = field(default_factory=list)
    untraced: str = ""            # why the step could not be traced (then only the formula's model state is here)
