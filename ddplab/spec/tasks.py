"""What the ranks do: one spec section per task, each declaring its settings, its phases and its runner.

A task is declared once, here or in a module of your own, and runs unchanged through every stage:

    @register
    @dataclass(frozen=True, kw_only=True)
    class AllReduceSweep(TaskSpec):
        kind = "allreduce-sweep"                                  # its name in spec.json
        runner = "ddplab.rank.tasks.allreduce_sweep:run"           # called in every rank with a TaskContext
        record = AllReduceSweepRecord                              # its part of rank{r}.json (record.py)
        phases = (Phase("all-reduce sweep", order=5, collective="all_reduce"),)
        reads = frozenset({"world_size", ...})                     # Experiment fields it uses
        sweep_bytes: tuple[int, ...] = ()                          # its own settings, validated in check()

- `phases` are what the rank logs as it goes (`rundir.ProgressLog`): the launcher's progress line and the
  hang diagnosis (`failures.py`) order the ranks by (step, micro, phase order) and name the collective a
  phase waits in. A rank in step s has finished s steps; entering a phase with `ends_step` finishes step
  s too (the progress counter). A phase with `deviation` is never part of a healthy run (an injected
  fault).
- `reads`: an Experiment field outside it that differs from its default is refused with a ValueError
  naming it, so no setting is silently ignored.
- A task declared outside ddplab is found again in every rank through the module named in spec.json:
  the rank worker imports it (it runs what the launcher wrote for you). Reading a spec never imports
  it: `from_dict` refuses a kind that is not registered yet, naming the module to import yourself.
Pure: no torch. Used by `Experiment` (spec/experiment.py), the launcher, the worker and `results`.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import ClassVar

from ..predict.balance import POLICIES as BALANCE_POLICIES
from ..predict.balance import calibration_shapes
from ..record import AllReduceSweepRecord, BalanceRecord, BucketSweepRecord, TrainRecord
from .checks import bad, is_int


@dataclass(frozen=True)
class Phase:
    name: str
    order: int                      # position inside one (step, micro-step): a rank further along has more
    collective: str | None = None   # the collective a rank in this phase waits in, if any
    ends_step: bool = False         # entering it means the step is done (the progress counter)
    deviation: bool = False         # not part of a healthy run (an injected fault)
    after_steps: bool = False       # comes after every step (teardown), whatever step it names


# every task's rank goes through these, around the task's own phases
COMMON_PHASES = (Phase("start", 0), Phase("init-process-group", 1, "rendezvous of all ranks"),
                 Phase("teardown", 90, after_steps=True), Phase("done", 91, after_steps=True))

_REGISTRY: dict[str, type] = {}


def register(cls):
    """Make a task known by its `kind` (a class decorator); ddplab's own are registered below."""
    if not (isinstance(getattr(cls, "kind", None), str) and isinstance(getattr(cls, "runner", None), str)
            and re.fullmatch(r"[\w.]+:\w+", cls.runner)):
        raise ValueError(f"task {cls.__name__}: needs a `kind` and a `runner` 'package.module:function'")
    taken = _REGISTRY.get(cls.kind)
    if taken is not None and taken.__qualname__ != cls.__qualname__:
        raise ValueError(f"task kind {cls.kind!r} is already taken by {taken.__module__}.{taken.__qualname__}")
    _REGISTRY[cls.kind] = cls
    return cls


def kinds() -> list[str]:
    return sorted(_REGISTRY)


@dataclass(frozen=True, kw_only=True)
class TaskSpec:
    """The base of every task section (see the module docstring)."""

    kind: ClassVar[str]
    runner: ClassVar[str]
    record: ClassVar[type]
    phases: ClassVar[tuple[Phase, ...]]
    reads: ClassVar[frozenset[str] | None]   # None: every Experiment field
    step_unit: ClassVar[str] = "steps"

    def __post_init__(self):
        for f in dataclasses.fields(self):   # lists from a caller or from JSON: tuples, so the spec hashes
            if isinstance(getattr(self, f.name), list):
                object.__setattr__(self, f.name, tuple(getattr(self, f.name)))

    def check(self, exp) -> None:
        """Validate this section against the whole experiment; ValueError naming the field."""

    def total_steps(self, exp) -> int:
        """How many `ends_step` phases a rank goes through (the progress line's denominator)."""
        return exp.steps

    def all_phases(self) -> dict[str, Phase]:
        return {p.name: p for p in (*COMMON_PHASES, *self.phases)}

    def to_dict(self) -> dict:
        d = {"kind": self.kind, **{k: list(v) if isinstance(v, tuple) else v
                                   for k, v in dataclasses.asdict(self).items()}}
        if not type(self).__module__.startswith("ddplab."):
            d["module"] = type(self).__module__
        return d

    @staticmethod
    def from_dict(d) -> "TaskSpec":
        if isinstance(d, TaskSpec):
            cls = type(d)
            if _REGISTRY.get(getattr(cls, "kind", None)) is not cls:
                bad("task", f"{cls.__name__} is not registered: decorate it with @register")
            if cls.__module__ == "__main__":
                bad("task", f"{cls.__name__} is defined in __main__ (a notebook or a script): every rank imports "
                            f"a task from its module, so define it in an importable module")
            return d
        if isinstance(d, str):
            d = {"kind": d}
        if not isinstance(d, dict) or "kind" not in d:
            bad("task", f"must be a task section such as Train() or AllReduceSweep(...) (got {d!r})")
        d = dict(d)
        kind, module = d.pop("kind"), d.pop("module", None)
        if isinstance(kind, str) and kind not in _REGISTRY and isinstance(module, str) and module:
            # never imported from here: a spec or a run directory would run code by naming a module
            bad("task", f"kind {kind!r} is declared in module {module!r}, which is not imported; ddplab never "
                        f"imports a module that a file names. If it is your own task, import it first "
                        f"(`import {module}`; on the command line: ddplab run --import {module} --spec ...)")
        if not isinstance(kind, str) or kind not in _REGISTRY:
            bad("task", f"must be one of {', '.join(kinds())} (got {kind!r})")
        cls = _REGISTRY[kind]
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            bad("task", f"{kind} has no setting(s) {', '.join(unknown)}")
        return cls(**d)


RUN_FIELDS = frozenset({"name", "task", "world_size", "backend", "device", "timeout_s", "pin_cpus"})
MODEL_FIELDS = frozenset({"model", "vocab_size", "d_model", "n_layers", "n_heads", "tie_weights", "checkpointing",
                          "seed", "dtype", "local_batch", "seq_len"})
GRADIENT_ALL_REDUCE = "DDP gradient all-reduce"


@register
@dataclass(frozen=True, kw_only=True)
class Train(TaskSpec):
    """DDP training steps (or FSDP2, ZeRO-1, no synchronization): every Experiment field applies."""

    kind = "train"
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


@register
@dataclass(frozen=True, kw_only=True)
class AllReduceSweep(TaskSpec):
    """Time all_reduce of every size in `sweep_bytes`, `repeats` times, sizes in alternating order."""

    kind = "allreduce-sweep"
    runner = "ddplab.rank.tasks.allreduce_sweep:run"
    record = AllReduceSweepRecord
    phases = (Phase("allocate buffers", 4), Phase("all-reduce sweep", 5, "all_reduce"))
    reads = RUN_FIELDS
    step_unit = "repeats"
    sweep_bytes: tuple[int, ...] = ()
    repeats: int = 20

    def check(self, exp) -> None:
        sizes = list(self.sweep_bytes) if isinstance(self.sweep_bytes, tuple) else None
        if not sizes or not all(is_int(n) and n >= 4 and n % 4 == 0 for n in sizes) or len(set(sizes)) != len(sizes):
            bad("task.sweep_bytes", f"an all-reduce sweep needs distinct message sizes, multiples of 4 bytes "
                                    f"(float32 elements) (got {sizes!r})")
        if not is_int(self.repeats) or not 1 <= self.repeats <= 10 ** 5:
            bad("task.repeats", f"must be an integer in 1..100000 (got {self.repeats!r})")
        if sum(self.sweep_bytes) > 2 ** 32:
            bad("task.sweep_bytes", f"at most 4 GiB of buffers in all (got {sum(self.sweep_bytes)} bytes)")

    def total_steps(self, exp) -> int:
        return self.repeats


# a bucket-sweep plan: "<kind>:<cap in MiB>"; ddp = torch DDP with the readiness and bucket probes,
# bare = torch DDP without probes, plan = BucketedSync with DDP's rule, split = the same with its last
# bucket cut in two, ddp-split = the split plan run by torch DDP itself (one `bucket_cap_mb_list` cap per
# bucket); "ddp:default" and "bare:default" leave bucket_cap_mb at None
PLAN_KINDS = ("ddp", "bare", "plan", "split", "ddp-split")
_PLAN = re.compile(r"^(ddp|bare|plan|split|ddp-split):(default|\d+(\.\d+)?(e-?\d+)?)$")


def parse_plan(plan: str) -> tuple[str, float | None]:
    """"split:4" -> ("split", 4.0); "ddp:default" -> ("ddp", None)."""
    kind, cap = plan.split(":")
    return kind, None if cap == "default" else float(cap)


def _plan_ok(plan) -> bool:
    if not isinstance(plan, str) or not _PLAN.match(plan):
        return False
    kind, cap = parse_plan(plan)
    return 0 < cap <= 2 ** 20 if cap is not None else kind in ("ddp", "bare")   # at most 1 TiB


@register
@dataclass(frozen=True, kw_only=True)
class BucketSweep(TaskSpec):
    """Time `steps_per_round` steps of every plan in `plans` (and of a compute-only step) in each of
    `rounds` interleaved rounds, after 2 warm-up steps each (`rank/tasks/bucket_sweep.py`). Its own
    optimizer is plain SGD with a small step: the sweep times synchronization, not training."""

    kind = "bucket-sweep"
    runner = "ddplab.rank.tasks.bucket_sweep:run"
    record = BucketSweepRecord
    phases = (Phase("construct", 1, "broadcast of rank 0's parameters"), Phase("warm-up", 2),
              Phase("round", 3))
    reads = RUN_FIELDS | MODEL_FIELDS | {"link"}
    step_unit = "rounds"
    plans: tuple[str, ...] = ()
    rounds: int = 5
    steps_per_round: int = 4

    def check(self, exp) -> None:
        plans = list(self.plans) if isinstance(self.plans, tuple) else None
        if not plans or not all(_plan_ok(p) for p in plans) or len(set(plans)) != len(plans):
            bad("task.plans", f"a bucket sweep needs distinct plans '<kind>:<cap MiB>' with kind one of "
                              f"{', '.join(PLAN_KINDS)} and a cap > 0 ('default' for ddp and bare) (got {plans!r})")
        for name in ("rounds", "steps_per_round"):
            v = getattr(self, name)
            if not is_int(v) or not 1 <= v <= 10 ** 4:
                bad(f"task.{name}", f"must be an integer in 1..10000 (got {v!r})")
        if any(isinstance(v, tuple) for v in (exp.local_batch, exp.seq_len)):
            bad("local_batch", "a bucket sweep gives every rank the same work: one local_batch and one seq_len")

    def total_steps(self, exp) -> int:
        return self.rounds


BALANCE_ALL_REDUCE = "all_reduce of the flattened gradient"


@register
@dataclass(frozen=True, kw_only=True)
class BalanceStudy(TaskSpec):
    """Equal tokens, unequal cost (`rank/tasks/balance.py`, notebook 07): calibrate a cost model of
    forward+backward on this machine, share the sequences of `pool` (their lengths) among the ranks by
    each policy in `policies` ("tokens": equal tokens, one length per rank; "cost": balanced estimated
    cost, `predict/balance.py`), check both reduce the same gradient, then time `steps_per_round`
    steps of each in each of `rounds` rounds, alternating. No optimizer step: the study times compute
    and waiting, and every step starts from the same parameters. Calibration: every length in
    `calibration_lengths` at `calibration_tokens` tokens and at half as many, each timed
    `calibration_repeats` times. `seq_len` must hold the longest sequence (the position embedding)."""

    kind = "balance-study"
    runner = "ddplab.rank.tasks.balance:run"
    record = BalanceRecord
    phases = (Phase("build", 2), Phase("calibrate", 3),
              Phase("share-calibration", 4, "all-gather of the calibration points"),
              Phase("check", 5, BALANCE_ALL_REDUCE), Phase("warm-up", 5, BALANCE_ALL_REDUCE),
              Phase("round", 6, BALANCE_ALL_REDUCE),
              Phase("share-arrivals", 7, "all-gather of the arrival times", after_steps=True))
    reads = RUN_FIELDS | (MODEL_FIELDS - {"local_batch"})
    step_unit = "rounds"
    pool: tuple[int, ...] = ()
    policies: tuple[str, ...] = BALANCE_POLICIES
    calibration_lengths: tuple[int, ...] = (32, 64, 128, 256, 512)
    calibration_tokens: int = 1024
    calibration_repeats: int = 5
    rounds: int = 5
    steps_per_round: int = 3

    def check(self, exp) -> None:
        pool = list(self.pool) if isinstance(self.pool, tuple) else None
        if not pool or not all(is_int(n) and 1 <= n <= 2 ** 16 for n in pool) or sum(pool) > 2 ** 20:
            bad("task.pool", f"needs the sequence lengths of one global batch, integers in 1..65536, at most "
                             f"2**20 tokens in all (got {self.pool!r})")
        if is_int(exp.world_size) and len(pool) < exp.world_size:
            bad("task.pool", f"{len(pool)} sequences cannot give each of world_size={exp.world_size} ranks one")
        policies = list(self.policies) if isinstance(self.policies, tuple) else None
        if not policies or not all(p in BALANCE_POLICIES for p in policies) or len(set(policies)) != len(policies):
            bad("task.policies", f"distinct policies from {', '.join(BALANCE_POLICIES)} (got {self.policies!r})")
        lengths = list(self.calibration_lengths) if isinstance(self.calibration_lengths, tuple) else None
        if not lengths or len(lengths) < 2 or not all(is_int(n) and n >= 1 for n in lengths) or \
                len(set(lengths)) != len(lengths):
            bad("task.calibration_lengths", f"at least 2 distinct positive lengths (got {self.calibration_lengths!r})")
        if max(lengths) < max(pool):
            bad("task.calibration_lengths", f"must reach the longest sequence of the pool ({max(pool)}), so the cost "
                                            f"model is not extrapolated (got up to {max(lengths)})")
        t = self.calibration_tokens
        if not is_int(t) or not 1 <= t <= 2 ** 20 or any(t % (2 * n) for n in lengths):
            bad("task.calibration_tokens", f"must be at most 2**20 and a multiple of twice every calibration length "
                                           f"(it is timed at that many tokens and at half) (got {t!r})")
        for name, top in (("calibration_repeats", 1000), ("rounds", 10 ** 4), ("steps_per_round", 10 ** 4)):
            v = getattr(self, name)
            if not is_int(v) or not 1 <= v <= top:
                bad(f"task.{name}", f"must be an integer in 1..{top} (got {v!r})")
        longest = max(max(pool), max(lengths))
        if not is_int(exp.seq_len) or exp.seq_len < longest:
            bad("seq_len", f"the model's position embedding holds seq_len tokens: set one seq_len of at least "
                           f"{longest}, the longest sequence of the pool and of the calibration (got {exp.seq_len!r})")

    def shapes(self) -> list[tuple[int, int]]:
        """The calibration micro-batches (count, length); rank r times every world_size-th one from r."""
        return calibration_shapes(self.calibration_lengths, self.calibration_tokens)

    def total_steps(self, exp) -> int:
        return self.rounds
