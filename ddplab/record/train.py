"""The train task's record: `TrainRecord`, its steps and what its probes add (pure: no torch)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .timeline import Backward, BucketEvent, Timeline


@dataclass(frozen=True)
class TrainStep(Timeline):
    step: int
    sample_ids: list[int]
    loss: float                    # mean token loss of this rank's examples
    loss_sum: float
    tokens: int
    phase_ms: dict[str, float]     # data, forward, backward, optimizer (and count): summed over micro-steps
    step_ms: float
    param_checksum: str
    backward: Backward | None = None           # readiness probe: the last micro-step's backward
    buckets: list[BucketEvent] | None = None   # buckets probe: every bucket launched in the step
    write_bytes: int | None = None             # bytes probe: written by this process during the last backward
    optimizer_write_bytes: int | None = None   # bytes probe: written during the optimizer step (ZeRO-1's broadcast)
    activation_bytes: list[int] | None = None  # activations probe: saved for backward, per micro-step
    forward_write_bytes: int | None = None     # bytes probe: written during the last forward (FSDP2's all-gathers)


@dataclass(frozen=True)
class MemoryStep:
    phases: dict[str, dict[str, int]]   # forward, backward, step -> category -> bytes (and rss, cuda_*)
    held_at_start: int
    peak: int


@dataclass(frozen=True)
class MemoryRecord:
    constructed: dict[str, int]
    steps: list[MemoryStep]
    parameter_numels: list[int] = field(default_factory=list)   # every parameter tensor, in parameters() order
    trainable: list[bool] = field(default_factory=list)         # its requires_grad (the memory model of a user's model)


@dataclass(frozen=True)
class Distance:
    max_abs_diff: float
    update_rel_error: float
    param_checksum: str = ""


@dataclass(frozen=True)
class ReferenceRecord:
    """After step 0: this rank's parameters and a lone replica's against the one-process update."""

    ddp: Distance
    independent: Distance


@dataclass(frozen=True)
class ModelInfo:
    parameter_count: int
    parameter_bytes: int
    gradient_bytes: int | None = None   # the trainable parameters' gradients: what DDP all-reduces

    @property
    def payload_bytes(self) -> int:
        """The gradient payload of one step (every parameter, in a record that predates `gradient_bytes`)."""
        return self.parameter_bytes if self.gradient_bytes is None else self.gradient_bytes


@dataclass(frozen=True)
class Checksums:
    built: str
    initial: str
    final: str


@dataclass(frozen=True)
class ProfileRecord:
    """The profiler's files for this rank (paths relative to the run directory), the steps it
    recorded, and the memory timeline's largest bytes per category over those steps."""

    steps: list[int]
    trace: str
    memory_timeline: str
    peak_bytes: dict[str, int]


@dataclass(frozen=True)
class TrainRecord:
    parameter_names: list[str]
    model: ModelInfo
    param_checksum: Checksums
    steps: list[TrainStep]
    unused_parameters: list[str] = field(default_factory=list)  # trainable, no gradient after step 0's backward
    reference: ReferenceRecord | None = None   # reference probe
    memory: MemoryRecord | None = None         # memory probe
    profile: ProfileRecord | None = None       # profile probe
