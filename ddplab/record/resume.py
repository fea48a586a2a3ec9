"""The resume task's record: where a run started, what it restored, every step it trained (pure: no torch)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ResumeStep:
    step: int                      # optimizer step of the whole trajectory (a resume starts at save_at)
    epoch: int                     # the sampler's epoch for this step's batch
    sample_ids: list[int]
    loss: float                    # mean token loss of this rank's batch
    loss_sum: float
    tokens: int
    augmented: int                 # input tokens the augmentation replaced in this rank's batch
    param_checksum: str            # after the step (training.parameter_checksum)
    step_ms: float


@dataclass(frozen=True)
class CheckpointInfo:
    """The checkpoint a run wrote (save_at) or resumed from (resume_from), as this rank saw it."""

    path: str
    step: int                      # optimizer steps done when it was written
    epoch: int
    rank_offset: int               # of the rank whose file was read (or written)
    epoch_consumed: int
    world_size: int                # of the run that wrote it
    local_batch: int
    dcp_bytes: int                 # DCP's files (model and optimizer), all ranks' together
    ms: float                      # how long dcp.save or dcp.load took on this rank


@dataclass(frozen=True)
class ResumeRecord:
    """A rank's part of rank{r}.json: where it started, what it restored, every step it trained."""

    start_step: int
    start_epoch: int
    start_offset: int              # ids of its shard of start_epoch it skipped
    restored: list[str]
    saved: CheckpointInfo | None   # written after the last step (save_at)
    resumed: CheckpointInfo | None  # read before the first step (resume_from)
    steps: list[ResumeStep]
