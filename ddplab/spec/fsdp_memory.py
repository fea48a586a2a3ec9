"""The FSDP2 memory task (notebook 09): what one rank holds, moment by moment, through one training step
of the built-in model under FSDP2 (`fully_shard`), for each combination of `reshard_after_forward` and
explicit prefetch, all in one launch.

    FsdpMemory()                                               # the four combinations
    FsdpMemory(reshard_after_forward=(True,), prefetch=(False,))

FSDP2 keeps only a shard of every unit's parameters, gradients and optimizer state on a rank. A unit is
one layer as ddplab shards it (`rank/parallel/fsdp.py`: every transformer block, embedding, norm and the
head; then the root). To compute, the ranks all-gather a unit's parameters; after its forward the unit
is resharded (freed) with `reshard_after_forward=True`, or kept until its backward with False; after its
backward, its gradients are reduce-scattered, each rank keeping its shard. With `prefetch=True` every
unit asks FSDP2 to start gathering the next unit in forward (`set_modules_to_forward_prefetch`) and the
previous one in backward (`set_modules_to_backward_prefetch`); without it FSDP2 does its default, which
already gathers the previous unit early in backward.

The record is a timeline per configuration: a sample at every unit's pre/post forward and pre/post
backward, each splitting the rank's live bytes into categories (`SAMPLE_CATEGORIES`), and the measured
peak of the step (on CUDA also the allocator's peak, `torch.cuda.max_memory_allocated`). The first `warmup_steps` steps are run and not recorded: in step 0 the optimizer
creates its state and FSDP2 allocates its gather buffers.
Pure: no torch. The rank side is `rank/tasks/fsdp_memory.py`, the pure model `predict/fsdp_memory.py`, the
views `tables/fsdp_memory.py` and `plots/fsdp_memory.py`, the experiments `recipes/fsdp_memory.py`.
Reference: https://pytorch.org/docs/stable/distributed.fsdp.fully_shard.html
"""

from __future__ import annotations

from dataclasses import dataclass

from ..predict.fsdp_memory import CATEGORIES as SAMPLE_CATEGORIES  # noqa: F401 (the record's categories, read by tables and the rank)
from ..record.fsdp_memory import FsdpMemoryRecord
from .checks import bad, is_int
from .tasks import MODEL_FIELDS, RUN_FIELDS, Phase, TaskSpec, register

# SAMPLE_CATEGORIES: what a sample splits the live bytes into, the memory model's own categories
# (rank/tasks/fsdp_memory.py says how each is counted)
# the moments a sample is taken at; "pre-backward" of a unit comes before FSDP2 gathers it again,
# "post-backward" after its gradients are computed and before they are reduce-scattered
SAMPLE_EVENTS = ("step-start", "pre-forward", "post-forward", "loss", "pre-backward", "post-backward",
                 "backward-end", "optimizer-end")
FSDP_MODELS = ("transformer", "mlp")
MAX_WARMUP_STEPS = 10


def _bools(value) -> bool:
    return isinstance(value, tuple) and len(value) >= 1 and all(isinstance(v, bool) for v in value) \
        and len(set(value)) == len(value)


@register
@dataclass(frozen=True, kw_only=True)
class FsdpMemory(TaskSpec):
    """For every combination of `reshard_after_forward` x `prefetch`: build the model from the seed,
    shard it with FSDP2, run `warmup_steps` optimizer steps, then record one more step's memory
    timeline (`rank/tasks/fsdp_memory.py`)."""

    kind = "fsdp-memory"
    runner = "ddplab.rank.tasks.fsdp_memory:run"
    record = FsdpMemoryRecord
    phases = (Phase("build", 2), Phase("fsdp-construct", 3, "sharding of the parameters"),
              Phase("warm-up", 4, "FSDP2's all-gather or reduce-scatter"),
              Phase("measured step", 5, "FSDP2's all-gather or reduce-scatter"))
    reads = RUN_FIELDS | MODEL_FIELDS | {"optimizer", "lr", "momentum"}
    step_unit = "configurations"
    reshard_after_forward: tuple[bool, ...] = (True, False)
    prefetch: tuple[bool, ...] = (False, True)
    warmup_steps: int = 1

    def __post_init__(self):
        for name in ("reshard_after_forward", "prefetch"):   # one setting alone: a one-entry tuple
            if isinstance(getattr(self, name), bool):
                object.__setattr__(self, name, (getattr(self, name),))
        super().__post_init__()

    def configs(self) -> list[tuple[bool, bool]]:
        """(reshard_after_forward, prefetch) of every configuration, in the order the ranks run them."""
        return [(r, p) for r in self.reshard_after_forward for p in self.prefetch]

    def check(self, exp) -> None:
        for name in ("reshard_after_forward", "prefetch"):
            if not _bools(getattr(self, name)):
                bad(f"task.{name}", f"True, False, or distinct ones of them such as (True, False) "
                                    f"(got {getattr(self, name)!r})")
        if not is_int(self.warmup_steps) or not 1 <= self.warmup_steps <= MAX_WARMUP_STEPS:
            bad("task.warmup_steps", f"an integer in 1..{MAX_WARMUP_STEPS}: step 0 is never typical (the optimizer "
                                     f"creates its state, FSDP2 its buffers) (got {self.warmup_steps!r})")
        if exp.model not in FSDP_MODELS:
            bad("model", f"the FSDP2 memory task shards a built-in model whose units the memory model knows: "
                         f"one of {', '.join(FSDP_MODELS)} (got {exp.model!r})")
        if exp.tie_weights:
            bad("tie_weights", "a weight shared by two FSDP2 units (embedding and head) would be sharded twice; "
                               "leave it False")
        if exp.checkpointing:
            bad("checkpointing", "the FSDP2 memory task measures saved activations; leave checkpointing False")
        if is_int(exp.world_size) and exp.world_size < 2:
            bad("world_size", f"sharding over one rank shards nothing: use at least 2 (got {exp.world_size})")

    def total_steps(self, exp) -> int:
        return len(self.configs())
