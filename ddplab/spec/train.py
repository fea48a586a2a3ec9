"""The train task's settings: DDP training steps (FSDP2, ZeRO-1 and no synchronization too); every
Experiment field applies. Its record: `record/train.py`; its rank: `rank/tasks/train.py`."""

from __future__ import annotations

from dataclasses import dataclass

from ..record.train import TrainRecord
from .tasks import GRADIENT_ALL_REDUCE, Phase, TaskSpec, register


@register
@dataclass(frozen=True, kw_only=True)
class Train(TaskSpec):
    """DDP training steps (or FSDP2, ZeRO-1, no synchronization): every Experiment field applies."""

    kind = "train"
    feeds_own_data = True
    runner = "ddplab.rank.tasks.train:run"
    record = TrainRecord
    phases = (Phase("build", 2), Phase("ddp-construct", 3, "broadcast of rank 0's parameters"),
              Phase("fsdp-construct", 3, "sharding of the parameters"), Phase("reference", 3),
              Phase("count", 4, "all-reduce of the example or token counts"), Phase("forward", 5),
              Phase("backward", 6), Phase("skip-backward", 6, f"barrier instead of the {GRADIENT_ALL_REDUCE}",
                                          deviation=True),
              Phase("extra-all-reduce", 6, "an all_reduce that no other rank issued", deviation=True),
              Phase("sigkill", 6, deviation=True),
              Phase("optimizer", 7, ends_step=True),
              # the profile probe's export after the last step (rank/probes/profile.py): minutes on a busy machine
              Phase("profile-stop", 80, after_steps=True), Phase("profile-export-trace", 81, after_steps=True),
              Phase("profile-memory-timeline", 82, after_steps=True))
    reads = None          # every field

    def extra_groups(self, exp) -> tuple[tuple[tuple[int, ...], str | None], ...]:
        # the skip-backward fault's barrier on NCCL: a gloo group over the same ranks (a CPU barrier cannot
        # pair with an NCCL bucket; it times out and raises like gloo's). Made on gloo too, unused there.
        skips = exp.fault is not None and exp.fault.kind == "skip-backward"
        return ((tuple(range(exp.world_size)), "gloo"),) if skips else ()
