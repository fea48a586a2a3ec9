"""Plan a model at a cluster's world size from this machine: the planner process, started and read.

    plan = ddplab.plan(model="hf:llama-2-7b", world_size=64, strategy="fsdp2", seq_len=2048, local_batch=1)
    plan.peak_bytes, plan.held["optimizer_state"], plan.collectives
    plans = ddplab.plan_many(model="transformer", world_sizes=(8, 64, 1024), strategies=("ddp", "fsdp2"))

The plans of one call run in one planner process (`python -m ddplab.rank.planner specs.json plan`,
rank/planner.py), one after another: rank 0 of a fake process group, one training step under FakeTensorMode
each. It is started under the lab's keeper (launch/torchrun.py `start`), so it dies with its caller, and it
is bounded by the sum of the specs' `timeout_s`. Every spec is checked here, before anything starts (a
ValueError naming the field).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..record.envelope import parse
from ..record.plan import PlanRecord
from ..spec.plan import STRATEGIES, PlanSpec
from .torchrun import kill_tree, start, worker_env

GIB = 1 << 30


@dataclass(frozen=True)
class Plan:
    """A planned step: the spec and the planner's record (record/plan.py), with a few readings."""

    spec: PlanSpec
    record: PlanRecord

    def __getattr__(self, name):   # the record's fields: plan.held, plan.peak_bytes, plan.collectives, ...
        if name in {f.name for f in dataclasses.fields(PlanRecord)}:
            return getattr(self.record, name)
        raise AttributeError(name)

    def fits(self, device_gib: float) -> bool:
        """Whether the step's peak fits in `device_gib` GiB of device memory (tensor bytes only: nothing else on
        the device); False for a plan that could not trace the step (it has no peak)."""
        return not self.record.untraced and self.record.peak_bytes <= device_gib * GIB

    def wire_bytes(self) -> int:
        """Bytes rank 0 sends in the step, every collective together."""
        return sum(c.wire_bytes for c in self.record.collectives)


class PlanFailed(RuntimeError):
    """The planner process failed: its last lines say why."""


def plan_step(spec: PlanSpec | None = None, **fields) -> Plan:
    """Plan one step of `spec` (or a PlanSpec built from `fields`) in a planner process."""
    return plan_all([spec.replace(**fields) if spec is not None else PlanSpec(**fields)])[0]


def plan_all(specs: list[PlanSpec], progress=None) -> list[Plan]:
    """Every spec planned in one planner process, in order, bounded by the sum of their `timeout_s`;
    `progress(plan)` is called as each one arrives."""
    if not specs:
        raise ValueError("specs: nothing to plan (an empty list; world_sizes or strategies empty?)")
    timeout_s = sum(s.timeout_s for s in specs)
    with tempfile.TemporaryDirectory(prefix="ddplab-plan-") as d:
        spec_path, out = Path(d) / "specs.json", Path(d) / "plan"
        spec_path.write_text(json.dumps([s.to_dict() for s in specs]))
        proc = start([sys.executable, "-m", "ddplab.rank.planner", str(spec_path), str(out)], worker_env(),
                     subprocess.PIPE, text=True)
        plans: list[Plan] = []
        try:
            said = _wait(proc, out, specs, plans, progress, time.monotonic() + timeout_s)
        except subprocess.TimeoutExpired:
            kill_tree(proc, spec_path)
            spec = specs[min(len(plans), len(specs) - 1)]
            raise TimeoutError(f"the plan of {spec.model} at {spec.world_size} ranks ({spec.strategy}) ran past "
                               f"timeout_s={timeout_s:g} s (the plans together); the planner was stopped") from None
        except BaseException:
            kill_tree(proc, spec_path)
            raise
        _collect(out, specs, plans, progress)
        if proc.returncode != 0 or len(plans) < len(specs):
            raise _failure(specs[len(plans)] if len(plans) < len(specs) else specs[-1], said or "")
    return plans


def _wait(proc, out: Path, specs, plans: list, progress, deadline: float) -> str:
    """Read the planner's output until it ends, collecting each record as it is written."""
    while True:
        try:
            said, _ = proc.communicate(timeout=min(0.5, max(0.01, deadline - time.monotonic())))
            return said
        except subprocess.TimeoutExpired:
            _collect(out, specs, plans, progress)
            if time.monotonic() >= deadline:
                raise


def _collect(out: Path, specs, plans: list, progress) -> None:
    while len(plans) < len(specs) and (f := out.with_suffix(f".{len(plans)}.json")).exists():
        plans.append(Plan(specs[len(plans)], parse(PlanRecord, json.loads(f.read_text()), "plan")))
        if progress:
            progress(plans[-1])


def _failure(spec: PlanSpec, said: str) -> Exception:
    """A ValueError the planner raised (bad input it found: a model it cannot trace) is raised here as
    one; anything else is a PlanFailed with the planner's last lines."""
    lines = [ln for ln in said.splitlines() if ln.strip() and "Warning" not in ln and not ln.startswith("  warnings.")]
    last = lines[-1] if lines else ""
    for prefix in ("ValueError: ", "[rank0]: ValueError: "):
        if last.startswith(prefix):
            return ValueError(last[len(prefix):])
    tail = "\n".join(lines[-12:])
    return PlanFailed(f"the planner failed on {spec.model} at {spec.world_size} ranks ({spec.strategy}):\n{tail}")


def plan_many(spec: PlanSpec | None = None, world_sizes=(8, 64, 1024), strategies=STRATEGIES, progress=None,
              **fields) -> list[Plan]:
    """One plan per world size and strategy, in that order, in one planner process (or, where `spec` is a
    list of PlanSpecs, one plan of each); every spec is checked before it starts. `progress(plan)` is called
    as each plan arrives."""
    if isinstance(spec, (list, tuple)):   # specs of their own: planned as they are
        return plan_all([s.replace(**fields) for s in spec], progress)
    base = spec.replace(**fields) if spec is not None else PlanSpec(**fields)
    specs = [base.replace(world_size=w, strategy=s, **({} if s == "fsdp2" else {"reshard_after_forward": True}))
             for w in world_sizes for s in strategies]
    return plan_all(specs, progress)
