"""The FSDP memory task's record: the units, and one sampled step per configuration (pure: no torch)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FsdpUnit:
    """One FSDP2 unit on this rank: its parameter tensors and what they take sharded and gathered."""

    name: str                     # the module's name in the model ("blocks.0", "tok_emb")
    numels: list[int]             # every parameter tensor's elements (unsharded)
    dim0: list[int]               # every parameter tensor's size along dim 0, the dimension FSDP2 shards
    shard_bytes: int              # this rank's shard, padded: its storage
    gathered_bytes: int           # the unit's parameters while gathered (padded to a multiple of world size)


@dataclass(frozen=True)
class MemorySample:
    """The rank's live bytes at one moment of the step, by category (`SAMPLE_CATEGORIES`)."""

    event: str                    # one of SAMPLE_EVENTS
    unit: int | None              # the unit it is about (an index into FsdpMemoryRecord.units), if any
    t_ns: int
    bytes: dict[str, int]
    total: int                    # every live byte: held at the step's start + what the step allocated
    peak_since_last: int          # the most live at once since the previous sample (between samples)
    gathered_units: list[int]     # the units whose unsharded parameters are allocated now


@dataclass(frozen=True)
class FsdpConfigRecord:
    """One configuration's recorded step on this rank."""

    reshard_after_forward: bool
    prefetch: bool
    samples: list[MemorySample]
    held_at_start: int            # sharded parameters and optimizer state before the step
    peak_bytes: int               # the measured peak of the step: the most live at once
    loss: float
    step_ms: float
    # on CUDA, torch.cuda.max_memory_allocated over the step (the allocator's view, beside the tally of
    # storages above, which is what the model is validated against on the CPU); None on the CPU
    cuda_peak_bytes: int | None = None


@dataclass(frozen=True)
class FsdpMemoryRecord:
    """A rank's part of rank{r}.json: its units and one recorded step per configuration."""

    units: list[FsdpUnit]
    parameter_bytes: int          # every parameter, unsharded and unpadded (a checkpoint's parameters)
    configs: list[FsdpConfigRecord]
