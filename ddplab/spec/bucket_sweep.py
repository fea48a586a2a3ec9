"""The bucket sweep's settings and its plans (notebook 05, `ddplab tune-buckets`). Its record:
`record/bucket_sweep.py`; its rank: `rank/tasks/bucket_sweep.py`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

from ..record.bucket_sweep import BucketSweepRecord
from .checks import bad, int_in, same_work_on_every_rank
from .tasks import MODEL_FIELDS, RUN_FIELDS, Phase, TaskSpec, register


# a bucket-sweep plan: "<kind>:<cap in MiB>"; ddp = torch DDP with the readiness and bucket probes,
# bare = torch DDP without probes, plan = BucketedSync with DDP's rule, split = the same with its last
# bucket cut in two, ddp-split = the split plan run by torch DDP itself (one `bucket_cap_mb_list` cap per
# bucket); "ddp:default" and "bare:default" leave bucket_cap_mb at None
PLAN_KINDS = ("ddp", "bare", "plan", "split", "ddp-split", "ddp-2x")
_PLAN = re.compile(r"^(ddp|bare|plan|split|ddp-split|ddp-2x):(default|\d+(\.\d+)?(e-?\d+)?)$")


class Plan(NamedTuple):
    """A bucket-sweep plan, typed: `kind` (PLAN_KINDS) and `cap_mb` (None: DDP's default). Its name,
    `str(plan)`, is what a spec, a record and a table carry ("ddp:8", "split:4", "ddp:default")."""

    kind: str
    cap_mb: float | None = None

    def __str__(self) -> str:
        return f"{self.kind}:{'default' if self.cap_mb is None else f'{self.cap_mb:g}'}"

    @property
    def link_bandwidth(self) -> float:
        """Times `Experiment.link`'s bandwidth this plan's all-reduces are held to: 2 for "ddp-2x", else 1."""
        return 2.0 if self.kind == "ddp-2x" else 1.0

    @classmethod
    def parse(cls, name: str) -> "Plan":
        """"split:4" -> Plan("split", 4.0); "ddp:default" -> Plan("ddp", None); ValueError naming the plan
        for anything else."""
        if not isinstance(name, str) or not _PLAN.match(name):
            raise ValueError(f"plan {name!r}: expected '<kind>:<cap MiB>' with kind one of {', '.join(PLAN_KINDS)}")
        kind, cap = name.split(":")
        return cls(kind, None if cap == "default" else float(cap))


def _plan_ok(plan) -> bool:
    if not isinstance(plan, str) or not _PLAN.match(plan):
        return False
    kind, cap = Plan.parse(plan)
    return 0 < cap <= 2 ** 20 if cap is not None else kind in ("ddp", "bare", "ddp-2x")   # at most 1 TiB


@register
@dataclass(frozen=True, kw_only=True)
class BucketSweep(TaskSpec):
    """Time `steps_per_round` steps of every plan in `plans` (and of a compute-only step) in each of
    `rounds` interleaved rounds, after 2 warm-up steps each (`rank/tasks/bucket_sweep.py`). Its own
    optimizer is plain SGD with a small step: the sweep times synchronization, not training."""

    kind = "bucket-sweep"
    feeds_own_data = True
    runner = "ddplab.rank.tasks.bucket_sweep:run"
    record = BucketSweepRecord
    phases = (Phase("construct", 1, "broadcast of rank 0's parameters"), Phase("warm-up", 2),
              Phase("round", 3))
    reads = RUN_FIELDS | MODEL_FIELDS | {"link"}
    step_unit = "rounds"
    plans: tuple[str, ...] = ()     # plan names; a `Plan` given here is kept as its name

    def __post_init__(self):
        super().__post_init__()
        if isinstance(self.plans, tuple):
            object.__setattr__(self, "plans", tuple(str(p) if isinstance(p, Plan) else p for p in self.plans))
    rounds: int = 5
    steps_per_round: int = 4

    def check(self, exp) -> None:
        plans = list(self.plans) if isinstance(self.plans, tuple) else None
        if not plans or not all(_plan_ok(p) for p in plans) or len(set(plans)) != len(plans):
            bad("task.plans", f"a bucket sweep needs distinct plans '<kind>:<cap MiB>' with kind one of "
                              f"{', '.join(PLAN_KINDS)} and a cap > 0 ('default' for ddp and bare) (got {plans!r})")
        for name in ("rounds", "steps_per_round"):
            int_in(f"task.{name}", getattr(self, name), 1, 10 ** 4)
        if exp.link is None and any(p.startswith("ddp-2x:") for p in plans):
            bad("task.plans", f"a 'ddp-2x' plan runs on a link with twice the bandwidth of Experiment.link, and this "
                              f"experiment has no link (set link='1GbE', say; got plans {plans!r})")
        same_work_on_every_rank(exp, "a bucket sweep")

    def total_steps(self, exp) -> int:
        return self.rounds
