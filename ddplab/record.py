"""The rank record: the schema of `rank{r}.json`, shared by the rank that writes it and the notebook
that reads it (pure: no torch).

    {"schema_version": 2,
     "envelope": {rank, world_size, backend, device, pid, host, versions, spec_hash, launch_id, times},
     "result":   the task's own record: TrainRecord, AllReduceSweepRecord, BucketSweepRecord, ...}

Every event time is an integer number of nanoseconds since the launch's alignment barrier
(`rank/clock.py`: one time base for every rank, on one host or several); views turn it into
milliseconds after an origin of their choosing. A probe owns one
field of a step (`buckets`, `backward`, `write_bytes`, `activation_bytes`) or one section of the
task's record (`memory`, `reference`, `profile`). `dump` and `load` go through these definitions only, so a
file that does not match them is refused with the field that is wrong. Read through `results.Run`.
"""

from __future__ import annotations

import dataclasses
import statistics
import types
import typing
from dataclasses import dataclass, field

from .units import ms_after

SCHEMA_VERSION = 2


# ---- events: one time base ---------------------------------------------------------------------
@dataclass(frozen=True)
class ReadyEvent:
    """A parameter's gradient was accumulated into `.grad` (its post-accumulate-grad hook fired)."""

    param: str
    t_ns: int


@dataclass(frozen=True)
class BucketEvent:
    """One bucket's all-reduce: handed to the communication hook, and its future completed."""

    index: int
    bytes: int
    params: list[str]              # empty where the task keeps the layout once (a bucket sweep)
    launch_ns: int
    done_ns: int


@dataclass(frozen=True)
class Backward:
    """One backward: its start and return, and (readiness probe) every gradient's ready time."""

    start_ns: int
    end_ns: int
    ready: list[ReadyEvent] | None = None

    def ms(self, t_ns: int) -> float:
        return ms_after(t_ns, self.start_ns)

    @property
    def last_ready_ns(self) -> int:
        return self.ready[-1].t_ns


class Timeline:
    """Shared by the steps that carry a `backward` and `buckets`: times in ms after backward started."""

    backward: Backward | None
    buckets: list[BucketEvent] | None

    def ready_ms(self) -> list[tuple[str, float]]:
        return [(e.param, self.backward.ms(e.t_ns)) for e in self.backward.ready]

    @property
    def last_ready_ms(self) -> float:
        return self.backward.ms(self.backward.last_ready_ns)

    @property
    def first_launch_ms(self) -> float:
        return min(self.backward.ms(b.launch_ns) for b in self.buckets)

    @property
    def comm_end_ms(self) -> float:
        return max(self.backward.ms(b.done_ns) for b in self.buckets)

    @property
    def after_last_ready_ms(self) -> float:
        """Communication after the last gradient was ready: last all-reduce done minus last ready."""
        return self.comm_end_ms - self.last_ready_ms

    @property
    def exposed_tail_ms(self) -> float:
        """This rank's share of the exposed tail: `after_last_ready_ms`, or 0 where communication ended first."""
        return max(0.0, self.after_last_ready_ms)


def exposed_tail_ms(rank_steps) -> float:
    """The lab's one definition of a step's **exposed tail** (ms): over the ranks' records of one step,
    the longest time communication still ran after that rank's last gradient was ready (0 where it
    ended first). The step cannot end before it; summaries take the median over steps. It is not
    everything the step pays for communication: on shared cores the all-reduces also slow backward
    itself (notebooks 05 and 08 measure that beside it)."""
    return max(s.exposed_tail_ms for s in rank_steps)


# ---- the train task ------------------------------------------------------------------------------
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
    activation_bytes: list[int] | None = None  # activations probe: saved for backward, per micro-step


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


# ---- the all-reduce sweep --------------------------------------------------------------------------
@dataclass(frozen=True)
class SizeCalls:
    bytes: int
    ms: list[float]
    write_bytes: list[int]


@dataclass(frozen=True)
class AllReduceSweepRecord:
    sizes: list[SizeCalls]


# ---- the bucket sweep ------------------------------------------------------------------------------
@dataclass(frozen=True)
class SweepStep(Timeline):
    round: int
    forward_ms: float
    backward_ms: float
    optimizer_ms: float
    step_ms: float
    backward: Backward
    buckets: list[BucketEvent] | None = None


@dataclass(frozen=True)
class PlanCheck:
    """Relative max difference from the first plan: reduced gradient and update of the check step,
    and the parameters after every timed step."""

    grad_rel_diff: float
    param_rel_diff: float
    final_param_rel_diff: float | None = None


@dataclass(frozen=True)
class SweepArm:
    name: str
    layout: list[list[str]]        # bucket membership as observed (probed plans)
    check: PlanCheck | None
    steps: list[SweepStep]


@dataclass(frozen=True)
class BucketSweepRecord:
    parameter_names: list[str]
    parameter_bytes: dict[str, int]
    model: ModelInfo
    warmup_steps: int
    ready_order: list[str]         # rank 0's, which every rank's explicit plans follow
    copy_bytes_per_s: float
    arms: list[SweepArm]

    def arm(self, name: str) -> SweepArm:
        return next(a for a in self.arms if a.name == name)


# ---- the balance study ---------------------------------------------------------------------------
@dataclass(frozen=True)
class CalibrationPoint:
    """One calibration micro-batch: `count` sequences of `length` tokens, forward+backward on one rank
    alone (no synchronization), timed `len(ms)` times."""

    count: int
    length: int
    rank: int                      # the rank that measured it
    ms: list[float]

    @property
    def tokens(self) -> int:
        return self.count * self.length

    @property
    def sum_sq(self) -> int:
        return self.count * self.length ** 2

    @property
    def median_ms(self) -> float:
        return statistics.median(self.ms)


@dataclass(frozen=True)
class CostFit:
    """The cost model every rank fitted to the calibration points (`predict.balance.CostModel`)."""

    c_ms: float
    a_ms_per_token: float
    b_ms_per_sq: float


@dataclass(frozen=True)
class BalanceStep:
    """One timed step on one rank: forward+backward of its sequences from `start_ns` (every rank
    leaves a barrier together) to `arrival_ns` (its flattened gradient ready), then the all-reduce,
    which every rank leaves at `returned_ns`."""

    round: int
    start_ns: int
    arrival_ns: int
    returned_ns: int
    compute_ms: float              # start to arrival
    wait_ms: float                 # its own arrival to the last rank's arrival

    @property
    def allreduce_ms(self) -> float:
        return ms_after(self.returned_ns, self.arrival_ns)

    @property
    def step_ms(self) -> float:
        return ms_after(self.returned_ns, self.start_ns)


@dataclass(frozen=True)
class BalanceArm:
    """One policy on one rank: the sequences it was given (fixed for every step), what the cost model
    predicted for them, the check step's reduced gradient against the first policy's, the timed steps."""

    policy: str
    sequences: list[int]           # indices into the pool
    lengths: list[int]
    tokens: int
    sum_sq: int
    predicted_ms: float
    grad_rel_diff: float
    steps: list[BalanceStep]


@dataclass(frozen=True)
class BalanceRecord:
    model: ModelInfo
    pool: list[int]
    global_tokens: int
    warmup_steps: int
    calibration: list[CalibrationPoint]   # every rank's points, gathered (the same on every rank)
    fit: CostFit
    arms: list[BalanceArm]

    def arm(self, policy: str) -> BalanceArm:
        return next(a for a in self.arms if a.policy == policy)


# ---- the envelope ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Envelope:
    task: str
    rank: int
    local_rank: int
    world_size: int
    backend: str
    device: str
    pid: int
    host: str
    torch_version: str
    python: str
    spec_hash: str
    launch_id: str
    t_start_ns: int                # time.time_ns(): wall clock, for humans
    t_end_ns: int
    node: int = 0                  # torchrun's GROUP_RANK: the node (agent) the rank ran on
    aligned_at_ns: int = 0         # this host's raw monotonic clock at the alignment barrier (rank/clock.py)


@dataclass(frozen=True)
class RankRecord:
    envelope: Envelope
    result: object                 # the task's record class (`TaskSpec.record`)


# ---- writing and reading -----------------------------------------------------------------------------
def dump(rec: RankRecord) -> dict:
    """The JSON-ready dict of a rank record."""
    return {"schema_version": SCHEMA_VERSION, "envelope": dataclasses.asdict(rec.envelope),
            "result": dataclasses.asdict(rec.result)}


class RecordError(ValueError):
    """A rank file that does not match the schema; the message names the field."""


def load(d: dict, result_type: type) -> RankRecord:
    """Parse a rank file's dict into typed records; RecordError naming the first field that is wrong."""
    if not isinstance(d, dict):
        raise RecordError("is not a JSON object")
    if d.get("schema_version") != SCHEMA_VERSION:
        raise RecordError(f"has schema version {d.get('schema_version')}, expected {SCHEMA_VERSION}")
    for key in ("envelope", "result"):
        if key not in d:
            raise RecordError(f"lacks the field {key}")
    return RankRecord(parse(Envelope, d["envelope"], "envelope"), parse(result_type, d["result"], "result"))


def parse(tp, value, where: str):
    """`value` (from JSON) as type `tp`: dataclasses, list[X], dict[str, X], X | None, int, float, str."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        return parse(next(a for a in args if a is not type(None)), value, where)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise RecordError(f"{where}: expected an object, got {type(value).__name__}")
        hints = typing.get_type_hints(tp)
        fields = {f.name: f for f in dataclasses.fields(tp)}
        unknown = sorted(set(value) - set(fields))
        if unknown:
            raise RecordError(f"{where}: unknown field(s) {', '.join(unknown)}")
        kwargs = {}
        for name, f in fields.items():
            if name in value:
                kwargs[name] = parse(hints[name], value[name], f"{where}.{name}")
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise RecordError(f"{where}: lacks the field {name}")
        return tp(**kwargs)
    if origin is list:
        if not isinstance(value, list):
            raise RecordError(f"{where}: expected a list, got {type(value).__name__}")
        return [parse(args[0], v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise RecordError(f"{where}: expected an object, got {type(value).__name__}")
        return {k: parse(args[1], v, f"{where}.{k}") for k, v in value.items()}
    if tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if tp is object:
        return value
    if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
        raise RecordError(f"{where}: expected {tp.__name__}, got {value!r}")
    return value

