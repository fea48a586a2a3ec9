"""`ddplab tune-buckets` / `ddplab.tune_buckets(...)`: notebook 05's worked example as a tool.

On one set of warm ranks (the current `Session` if it fits, else one started for the two launches and
stopped after them: the model's imports and the process group are paid once):
1. capture: time all-reduces of this machine from 4 KiB to the gradient's size, and a bucket sweep
   with DDP's default only, whose compute-only arm records when every gradient becomes ready without
   communication competing (the ready order and times the simulator needs);
2. predict: fit the all-reduce line, cut DDP's plan from the measured ready order at every candidate
   cap (caps giving the same buckets count once), and simulate each step with the cost model
   calibrated on the default plan's measured step (tables.buckets.costs);
3. measure: the `measure` plans predicted fastest, DDP's default, and the fastest plan with its last
   bucket split in two (run by DDP itself through `bucket_cap_mb_list`), in interleaved rounds;
4. recommend the plan measured fastest, with its median step and spread, only where `claims` finds it
   faster than DDP's default on the paired steps (step i of each in the same round; the rounds
   alternate their order), and say plainly when this machine cannot resolve the two, or measured the
   default faster on the pairs;
5. with `compile_backend` (`--compile`): on the same ranks, the model under `torch.compile` beside eager
   at DDP's default and every measured cap DDPOptimizer can split at (`compiled.py`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from .. import claims, predict, rundir, tables
from ..recipes.buckets_and_overlap import ONE_PER_PARAMETER_MB
from ..recipes.communication import allreduce_sweep
from ..spec import BucketSweep
from ..spec.bucket_sweep import Plan
from ..spec.checks import is_number
from ..spec.experiment import MAX_BUCKET_CAP_MB as MAX_CAP_MB
from ..tables import bucket_sweep, buckets
from ..units import MIB
from .compiled import CompiledReport, compilable_caps, compile_settings, compiled_experiment
from .factory import checked, experiment, records, repeats_for

CAPS_MB = (ONE_PER_PARAMETER_MB, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 256)
DEFAULT = str(Plan("ddp"))   # "ddp:default"


def tune_buckets(model, world_size: int = 4, local_batch: int = 8, *, caps_mb=CAPS_MB, measure: int = 2,
                 rounds: int = 4, steps: int = 3, out=None, progress=True, pin_cpus: bool = True,
                 allreduce_repeats: int | None = None, compile_backend: str | None = None,
                 compile_mode: str = "ddp_optimizer", **fields) -> "BucketTuning":
    """Recommend a DDP bucket cap for `model` (a factory: spec/model.py) on `world_size` ranks: capture,
    predict every cap in `caps_mb`, measure the `measure` best predicted beside DDP's default and a split
    last bucket (`rounds` interleaved rounds of `steps` steps). Other Experiment fields by keyword. With
    `compile_backend` (aot_eager, inductor, eager), the measured caps also run under `torch.compile`
    (`optimize_ddp=compile_mode`) beside eager."""
    if compile_backend is not None:
        compile_settings(compile_backend, compile_mode)
    caps = tuple(caps_mb) if isinstance(caps_mb, (list, tuple)) else ()
    if not caps or not all(is_number(c) and 0 < c <= MAX_CAP_MB for c in caps):
        raise ValueError(f"caps_mb: one or more bucket caps in MiB, each > 0 and at most {MAX_CAP_MB} "
                         f"(got {caps_mb!r})")
    if not (isinstance(measure, int) and not isinstance(measure, bool) and 1 <= measure <= len(caps) + 1):
        raise ValueError(f"measure: how many of the plans predicted fastest to measure, 1..{len(caps) + 1} (got {measure!r})")
    base = experiment(model, "tune", fields, world_size=world_size, local_batch=local_batch, pin_cpus=pin_cpus)
    # the sweep settings are checked by the spec before anything starts, as every launch's are
    measuring = base.replace(task=BucketSweep(plans=(DEFAULT,), rounds=rounds, steps_per_round=steps))
    counted = checked(base)
    payload = counted.gradient_bytes
    top = 4096
    while top * 4 < payload:
        top *= 4   # powers of 4 below the gradient's size, and that size itself
    line = allreduce_sweep(world_size, max_bytes=top, repeats=repeats_for(payload, allreduce_repeats),
                           extra_bytes=(payload,), backend=base.backend, device=base.device, pin_cpus=pin_cpus,
                           name=f"{base.name}-allreduce")
    capture = base.replace(name=f"{base.name}-capture", task=BucketSweep(plans=(DEFAULT,), rounds=1, steps_per_round=3))
    from ..launch.cold import run_many
    from .. import launch

    def where(part):
        return None if out is None else f"{out}/{part}"

    before = launch.session.current()   # warm ranks that fit are used; ranks started here stop at the end
    try:
        ar_run, cap_run = run_many([line, capture], out=where("capture"), name=capture.name, progress=progress,
                                   warm=True)
        link, quality = tables.comm.fit_sweep(tables.comm.allreduce_sweep(ar_run))
        ins = bucket_sweep.inputs(cap_run)
        cost = buckets.costs(cap_run, link)["calibrated"]
        predicted = _predicted(ins, cost, caps)
        chosen = _chosen(predicted, ins, measure)
        sweep = measuring.replace(name=f"{base.name}-measure", task=BucketSweep(plans=tuple(chosen), rounds=rounds,
                                                                                 steps_per_round=steps))
        (meas_run,) = run_many([sweep], out=where("measure"), name=sweep.name, progress=progress, warm=True)
        compiled = None
        if compile_backend is not None:   # DDP's default and the measured caps DDPOptimizer can split at
            caps = compilable_caps([None, *(Plan.parse(p).cap_mb for p in chosen if Plan.parse(p).kind == "ddp")])
            (compiled,) = run_many([compiled_experiment(base, caps, compile_backend, compile_mode, rounds, steps)],
                                   out=where("compiled"), name=f"{base.name}-compiled", progress=progress, warm=True)
    finally:
        started = launch.session.current()
        if started is not None and started is not before:
            started.close()
    tuning = BucketTuning.of(base, link, quality, ins, predicted, meas_run, cost,
                             {"allreduce": str(ar_run.path), "capture": str(cap_run.path), "measure": str(meas_run.path)})
    if compiled is not None:
        tuning.compiled = CompiledReport.of(compiled, len(ins.grads))
        tuning.paths["compiled"] = str(compiled.path)
    return tuning


def _predicted(ins, cost, caps) -> pd.DataFrame:
    """One row per distinct plan (DDP's default first, then the caps in order; a cap whose buckets an
    earlier one already gives is left out): its buckets and the simulated step."""
    layouts = {DEFAULT: buckets.ddp_rule(ins, None)}
    for c in sorted(caps):
        plan = buckets.ddp_rule(ins, c)
        if plan not in layouts.values():
            layouts[str(Plan("ddp", c))] = plan
    rows = [{"plan": name, **buckets.summary(buckets.predict(ins, plan, cost))} for name, plan in layouts.items()]
    return pd.DataFrame(rows).set_index("plan")


def _chosen(predicted: pd.DataFrame, ins, measure: int) -> list[str]:
    """The `measure` plans predicted fastest, DDP's default, and the fastest numeric cap's plan with its
    last bucket split in two, if that bucket holds two tensors or more (DDP runs it with a cap list)."""
    fastest = list(predicted.sort_values("step_ms").index)
    chosen = fastest[:measure]
    if DEFAULT not in chosen:
        chosen.append(DEFAULT)
    for name in fastest:
        if name != DEFAULT and len(buckets.ddp_rule(ins, bucket_sweep.cap_of(name))[-1]) >= 2:
            chosen.append(str(Plan("ddp-split", Plan.parse(name).cap_mb)))
            break
    return chosen


@dataclass
class BucketTuning:
    """What `tune_buckets` found; `recommendation` is the setting to use, `verdict` says how sure."""

    spec: dict
    line: dict
    predicted: pd.DataFrame
    measured: pd.DataFrame
    best: str
    recommendation: str
    verdict: str
    outcome: str   # on "best beats the default": claims' "holds", "contradicted", "cannot resolve"; "not judged" if best is the default
    paths: dict = field(default_factory=dict)
    compiled: CompiledReport | None = None   # with compile_backend

    @classmethod
    def of(cls, exp, link, quality, ins, predicted, run, cost, paths) -> "BucketTuning":
        table = bucket_sweep.measured(run)
        synced = [p for p in table.index if p != "compute-only"]
        rows = table.loc[synced, ["buckets", "step_ms", "spread_ms", "exposed_tail_ms"]].copy()
        rows["predicted_ms"] = [buckets.predict(ins, buckets.plan_for(run, p, ins), cost).step_ms for p in synced]
        rows.loc["compute-only", ["step_ms", "spread_ms"]] = table.loc["compute-only", ["step_ms", "spread_ms"]]
        best = min(synced, key=lambda p: table.loc[p, "step_ms"])
        setting, verdict, outcome = recommend(bucket_sweep.steps(run), best, _setting(run, best, ins))
        return cls(spec={"factory": exp.model, "world_size": exp.world_size, "local_batch": exp.local_batch,
                         "seq_len": exp.seq_len, "gradient_mib": ins.gradient_bytes / MIB, "tensors": len(ins.grads),
                         "backward_ms": ins.backward_ms},
                   line=line_of(link, quality),
                   predicted=predicted, measured=rows, best=best, recommendation=setting,
                   verdict=verdict, outcome=outcome, paths=paths)

    def verify(self, measure: int = 2) -> None:
        """The tool's claims on its own runs (`verify.CheckFailed` where one fails): DDP's default, the
        `measure` plans predicted fastest and one split were measured, and the split DDP ran is the
        uncut plan with its last bucket cut in two, tensor for tensor. (The recommendation follows from
        the paired steps by `recommend`'s rule, so it is not re-checked here: the tests test the rule.)"""
        from .. import verify
        from ..results import load_run

        t = self.measured
        splits = [p for p in t.index if p.startswith("ddp-split:")]
        fastest = list(self.predicted.sort_values("step_ms").index[:measure])
        verify.that(f"every plan the tool chose came back measured: DDP's default, the {measure} predicted fastest, one split",
                    {DEFAULT, *fastest} <= set(t.index) and len(splits) == 1, seen=list(t.index),
                    expected=list(dict.fromkeys([DEFAULT, *fastest, "ddp-split:<cap>"])))
        run, ins = load_run(self.paths["measure"]), bucket_sweep.inputs(load_run(self.paths["capture"]))
        verify.that(f"{splits[0]}: DDP built the uncut plan with its last bucket cut in two",
                    buckets.is_last_split(buckets.plan_for(run, splits[0], ins),
                                          buckets.ddp_rule(ins, bucket_sweep.cap_of(splits[0]))))

    def to_dict(self) -> dict:
        return {"spec": self.spec, "line": self.line, "predicted": records(self.predicted),
                "measured": records(self.measured), "best": self.best,
                "recommendation": self.recommendation, "verdict": self.verdict, "outcome": self.outcome,
                "paths": self.paths, "compiled": None if self.compiled is None else self.compiled.to_dict()}

    def text(self) -> str:
        s, ln = self.spec, self.line
        return "\n".join([
            f"ddplab tune-buckets for {s['factory']}: {s['world_size']} ranks, local batch {s['local_batch']}, "
            f"{s['tensors']} gradients, {s['gradient_mib']:.2f} MiB; backward alone {s['backward_ms']:.1f} ms",
            f"all-reduce line of this machine: alpha {ln['alpha_ms']:.3f} ms, "
            + (f"{ln['bandwidth_gb_s']:.2f} GB/s" if ln["bandwidth_gb_s"] is not None else
               "no bandwidth resolved (the sweep's times did not grow with size)")
            + f" (median miss {ln['median_rel_error']:.0%})", "",
            "predicted (simulator, calibrated on DDP's default; ms):", self.predicted.round(2).to_string(), "",
            "measured (median of round medians, spread = robust standard deviation; ms):",
            self.measured.round(2).to_string(), "",
            f"recommendation: {self.recommendation}", self.verdict, "",
            *([self.compiled.text(), *self._not_compiled(), ""] if self.compiled is not None else []),
            "runs: " + ", ".join(f"{k} {rundir.shown(v)}" for k, v in self.paths.items())])


    def _not_compiled(self) -> list[str]:
        """The measured plans the compiled comparison left out, and why."""
        small = [p for p in self.measured.index if p.startswith("ddp:") and p != DEFAULT
                 and not compilable_caps([Plan.parse(p).cap_mb])]
        split = [p for p in self.measured.index if p.startswith("ddp-split:")]
        return ([f"not compiled: {', '.join(small)} (DDPOptimizer asserts its 1 MiB first bucket fits the cap)"] if small
                else []) + ([f"not compiled: {', '.join(split)} (DDPOptimizer splits at one cap; a cap list is DDP's "
                             f"alone)"] if split else [])


KEEP = "bucket_cap_mb=None (DDP's default)"


def line_of(link, quality) -> dict:
    """The fitted all-reduce line as JSON-ready data: a sweep whose times did not grow with size fits
    beta = 0, an unbounded bandwidth, written as None (JSON null) rather than inf."""
    bandwidth = link.bandwidth_bytes_per_s
    return {"alpha_ms": link.alpha_s * 1e3,
            "bandwidth_gb_s": bandwidth / 1e9 if math.isfinite(bandwidth) else None,
            "median_rel_error": quality.median_rel_error}


def faster_than_default(step_table: pd.DataFrame, plan: str) -> claims.Verdict:
    """"`plan` is faster than DDP's default", judged on the paired steps (`bucket_sweep.steps`)."""
    return claims.paired(f"{plan} is faster than DDP's default (its step minus the default's, per step)",
                         step_table[plan], step_table[DEFAULT], below=0.0)


def recommend(step_table: pd.DataFrame, best: str, setting: str) -> tuple[str, str, str]:
    """(the setting to use, the verdict in words, claims' outcome), from the paired steps
    (`bucket_sweep.steps`): `best`'s `setting` only where `best` is judged faster than DDP's default;
    otherwise DDP's default, saying why."""
    if best == DEFAULT:
        return KEEP, (f"DDP's default measured fastest (median of its steps {step_table[DEFAULT].median():.1f} ms): "
                      "keep it"), "not judged"
    v = faster_than_default(step_table, best)
    seen = f"(seen {v.effect()} a step)"
    if v.holds:
        return setting, f"{best} measured faster than DDP's default {seen}", v.outcome
    if v.contradicted:
        return KEEP, (f"{best} had the lowest median step, but paired step by step DDP's default was faster "
                      f"{seen}: keep the default"), v.outcome
    return KEEP, f"this machine cannot tell {best} from DDP's default {seen}: keep the default", v.outcome


def _setting(run, plan: str, ins) -> str:
    """The DDP argument that builds `plan`'s buckets."""
    kind, cap = Plan.parse(plan)
    if plan == DEFAULT:
        return KEEP
    if kind == "ddp-split":
        caps = predict.buckets.caps_for(buckets.plan_for(run, plan, ins), {g.name: g.bytes for g in ins.grads})
        return "bucket_cap_mb_list=[" + ", ".join(f"{c:.6g}" for c in caps) + "]"
    return f"bucket_cap_mb={cap:g}"
