"""`ddplab audit` / `ddplab.audit_model(...)`: one launch on your own model, and what DDP did with it.

One launch runs three experiments on the same ranks: the DDP run with the memory, readiness, bucket
and bytes probes (3 steps: step 0 with DDP's one first bucket, which records the ready order DDP's
rebuild follows; step 1, the memory table's step with optimizer state; step 2 with the rebuilt
buckets), the same steps without synchronization (compute alone), and the all-reduce of exactly the
gradient's size (a few sizes below it for the line). The report holds

- the model, counted here and by every rank (they must agree);
- the per-rank memory table, measured beside predicted, every category and the peak (tables.memory);
- the buckets DDP built (count, bytes, tensors, which parameters landed in the last one), checked
  against DDP's rule applied to the ready order it saw;
- the ready order against the source order, where they differ (tables.readiness.ready_order);
- the gradient payload and the bytes each rank wrote against the ring's 2(D-1)/D x payload;
- the compute-to-communication ratio of one step: forward+backward alone over the measured all-reduce;
- with `compile_backend` (`--compile`), a fourth experiment on the same ranks: the model under
  `torch.compile` beside eager at the audit's cap (`compiled.py`: torch's split, the step).
`ModelAudit.text()` prints it, `.to_dict()` is the same as data (`--json`); the run directories stay
for the notebooks (`ddplab.load_run(report.paths[...])`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from .. import predict, rundir, tables
from ..predict.comm import ring_bytes_per_rank
from ..recipes.communication import allreduce_sweep
from ..tables.buckets import rule_for
from ..units import MIB
from .compiled import CompiledReport, compilable_caps, compile_settings, compiled_experiment
from .factory import Counted, checked, experiment, records, repeats_for

PROBES = ("memory", "readiness", "buckets", "bytes")
STEPS, MEMORY_STEP, COMPUTE_STEPS = 3, 1, 4
LINE_FRACTIONS = (1 / 64, 1 / 8)   # all-reduce sizes below the gradient's, for the alpha-beta line


def audit_model(model, world_size: int = 4, optimizer: str = "sgd", local_batch=8, *, out=None, progress=True,
                allreduce_repeats: int | None = None, compile_backend: str | None = None,
                compile_mode: str = "ddp_optimizer", **fields) -> "ModelAudit":
    """Audit DDP on `model` (a factory 'package.module:function', or the function: spec/model.py) with
    `world_size` ranks, in one launch; other Experiment fields (seq_len, bucket_cap_mb, dtype, the
    factory's sizes...) by keyword. With `compile_backend` (aot_eager, inductor, eager) the launch also
    puts the model under `torch.compile` with `optimize_ddp=compile_mode` beside eager. A bad setting
    or a factory that cannot be audited is a ValueError before anything starts."""
    if compile_backend is not None:
        compile_settings(compile_backend, compile_mode)
    if not (isinstance(world_size, int) and not isinstance(world_size, bool) and world_size >= 2):
        raise ValueError(f"world_size: the audit compares what the ranks hold and send, so it needs at least 2 "
                         f"ranks (got {world_size!r})")
    exp = experiment(model, "audit", fields, world_size=world_size, optimizer=optimizer, local_batch=local_batch,
                      steps=STEPS, probes=PROBES)
    counted = checked(exp, activations=memory_checked(exp))   # one build, every process it starts stopped
    check_memory(exp, counted)
    payload = counted.gradient_bytes
    alone = exp.replace(name=f"{exp.name}-compute", sync="none", probes=(), steps=COMPUTE_STEPS, bucket_cap_mb=None,
                        gradient_as_bucket_view=False)   # no DDP: its settings stay at their defaults
    sizes = sorted({4096, *(max(4096, 4 * round(payload * f / 4)) for f in LINE_FRACTIONS)} - {payload})
    sweep = allreduce_sweep(world_size, min_bytes=4096, max_bytes=4096, repeats=repeats_for(payload, allreduce_repeats), extra_bytes=(*sizes, payload),
                            backend=exp.backend, device=exp.device, pin_cpus=exp.pin_cpus,
                            name=f"{exp.name}-allreduce")
    exps = [exp, alone, sweep]
    if compile_backend is not None:
        if not compilable_caps([exp.bucket_cap_mb]):
            raise ValueError(f"bucket_cap_mb: under --compile at least 1 MiB, or the default: DDPOptimizer asserts "
                             f"its 1 MiB first bucket fits the cap (got {exp.bucket_cap_mb!r})")
        exps.append(compiled_experiment(exp, [exp.bucket_cap_mb], compile_backend, compile_mode))
    from ..launch.cold import run_many

    ddp, compute, allreduce, *compiled = run_many(exps, out=out, name=exp.name, progress=progress)
    report = ModelAudit.of(exp, counted, ddp, compute, allreduce)
    if compiled:
        report.compiled = CompiledReport.of(compiled[0], counted.trainable_tensors)
        report.paths["compiled"] = str(compiled[0].path)
    return report


def memory_checked(exp) -> bool:
    """Does `check_memory` check `exp`: its ranks on the CPU, and DDPLAB_SKIP_SIZE_CHECKS unset."""
    import os

    from .. import host
    from ..launch.nodes import Nodes

    ranks = Nodes.from_env().ranks_here(exp.world_size)
    return not os.environ.get("DDPLAB_SKIP_SIZE_CHECKS") and \
        host.choose_backend(exp.backend, exp.device, ranks, host.cuda_device_count())[1] == "cpu"


def check_memory(exp, counted: Counted) -> None:
    """ValueError naming local_batch if the audit's ranks cannot hold `exp` in this machine's available
    memory (psutil, or a cgroup's limit): the launch's own estimate (model state: parameters, gradients,
    buckets, optimizer state; activations measured per example on one forward and loss of two), said
    as the largest local batch that fits. On a GPU, or with DDPLAB_SKIP_SIZE_CHECKS=1, nothing is checked."""
    from ..launch.keeper import children_stopped
    from ..launch.nodes import Nodes
    from ..launch.preflight import measured_activations, memory_available
    from ..units import DTYPE_BYTES

    if not memory_checked(exp):
        return
    ranks = Nodes.from_env().ranks_here(exp.world_size)
    per_example = counted.activations_per_example
    if per_example is None:   # counted without it: measured here, and what the factory starts is stopped
        with children_stopped(f"Experiment.model {exp.model}"):
            per_example = measured_activations(exp)
    parameter_bytes = counted.parameters * DTYPE_BYTES[exp.dtype]
    have, where = memory_available()
    fits = predict.memory.largest_local_batch(exp, parameter_bytes, per_example, have, ranks)
    asked = max(exp.local_batches)
    if asked > fits:
        state = predict.memory.rank_bytes_estimate(exp, parameter_bytes)
        need = ranks * (state + 2 * per_example * asked)
        raise ValueError(f"local_batch: {ranks} ranks of {exp.model} at a local batch of {asked} would need about "
                         f"{need / 2 ** 30:.1f} GiB ({state / 2 ** 30:.2f} GiB of model state and start-up per rank, "
                         f"and twice {per_example / 1024:.1f} KiB of activations per example, measured), and {where} "
                         f"{have / 2 ** 30:.1f} GiB available: "
                         + (f"use --local-batch {fits} or less" if fits else "not even model state fits; use fewer "
                            "ranks or a smaller model") + " (or set DDPLAB_SKIP_SIZE_CHECKS=1)")


@dataclass
class ModelAudit:
    """What `audit_model` found; `text()` to read, `to_dict()` as data."""

    spec: dict
    model: dict
    memory: pd.DataFrame
    buckets: pd.DataFrame
    layout: list[list[str]]        # every bucket's parameters, in launch order
    last_bucket: list[str]
    bucket_rule: dict
    ready_order: pd.DataFrame
    comm: dict
    compute: dict
    paths: dict = field(default_factory=dict)
    compiled: CompiledReport | None = None   # with compile_backend

    @classmethod
    def of(cls, exp, counted: Counted, ddp, compute, allreduce) -> "ModelAudit":
        rank0 = ddp.ranks[0]
        last = rank0.steps[-1]
        launched = sorted(last.buckets, key=lambda b: b.launch_ns)
        layout = [list(b.params) for b in launched]
        rows = [{"bucket": i, "bytes": b.bytes, "mib": b.bytes / MIB, "tensors": len(b.params), "first": b.params[0],
                 "last": b.params[-1]} for i, b in enumerate(launched)]
        order = tables.readiness.ready_order(ddp)
        differ = order[~order["as_assumed"]][["source_position", "reverse_source_position", "ready_position", "bucket"]]
        differ = differ.join(tables.readiness.off_line(order)[["swapped_within_module"]])
        wire = tables.comm.bytes_on_wire([ddp]).iloc[0]
        sizes = tables.comm.allreduce_sweep(allreduce)
        line, _ = tables.comm.fit_sweep(sizes)
        ratio = tables.comm.compute_vs_comm([compute], sizes, line).iloc[0]
        model = {"factory": exp.model, "parameter_tensors": counted.tensors, "parameters": counted.parameters,
                 "trainable_tensors": counted.trainable_tensors, "trainable_parameters": counted.trainable_parameters,
                 "gradient_bytes": counted.gradient_bytes,
                 "rank_parameters": [r.model.parameter_count for r in ddp.ranks],   # each rank's own count
                 "final_checksums": len({r.param_checksum.final for r in ddp.ranks})}   # distinct, over the ranks
        model["ranks_agree"] = set(model["rank_parameters"]) == {counted.parameters} and model["final_checksums"] == 1
        return cls(
            spec={"world_size": exp.world_size, "local_batch": exp.local_batch, "seq_len": exp.seq_len,
                  "optimizer": exp.optimizer, "dtype": exp.dtype, "bucket_cap_mb": exp.bucket_cap_mb,
                  "backend": ddp.ranks[0].backend, "device": ddp.ranks[0].device},
            model=model, memory=tables.memory.memory_table(ddp, step=MEMORY_STEP), buckets=pd.DataFrame(rows).set_index("bucket"),
            layout=layout, last_bucket=layout[-1], bucket_rule=_rule(exp, counted, rank0, layout), ready_order=differ,
            comm={"payload_bytes": int(wire["payload_mib"] * MIB), "written_bytes_per_rank": float(wire["written_mib_per_rank"] * MIB),
                  "ring_formula_bytes": ring_bytes_per_rank(counted.gradient_bytes, exp.world_size),
                  "written_over_formula": float(wire["ratio"])},
            compute={"compute_ms": float(ratio["compute_ms"]), "compute_ms_min": float(ratio["compute_ms_min"]),
                     "compute_ms_max": float(ratio["compute_ms_max"]), "allreduce_ms": float(ratio["allreduce_ms"]),
                     "allreduce_ms_line": float(ratio["allreduce_ms_fit"]), "compute_to_comm": float(ratio["compute_to_comm"]),
                     "last_bucket_ms_line": float(line.predict(launched[-1].bytes) * 1e3)},
            paths={"ddp": str(ddp.path), "compute": str(compute.path), "allreduce": str(allreduce.path)})

    def to_dict(self) -> dict:
        """The report as JSON-ready data (what `ddplab audit --json` writes)."""
        memory = {str(rank): {f"{c}_{kind}_mib": (None if math.isnan(v) else float(v)) for (c, kind), v in row.items()}
                  for rank, row in self.memory.iterrows()}
        return {"spec": self.spec, "model": self.model, "memory_mib": memory,
                "buckets": records(self.buckets), "layout": self.layout, "last_bucket": self.last_bucket,
                "bucket_rule": self.bucket_rule,
                "ready_order_differs": records(self.ready_order),
                "comm": self.comm, "compute": self.compute, "paths": self.paths,
                "compiled": None if self.compiled is None else self.compiled.to_dict()}

    def text(self) -> str:
        """The report as a terminal reads it."""
        m, s, c, k = self.model, self.spec, self.comm, self.compute
        out = [f"ddplab audit of {m['factory']}: {s['world_size']} ranks ({s['backend']} on {s['device']}), local batch "
               f"{s['local_batch']}, seq_len {s['seq_len']}, {s['optimizer']}, {s['dtype']}",
               "",
               f"model: {m['parameters']:,} parameters in {m['parameter_tensors']} tensors; {m['trainable_parameters']:,} "
               f"trainable in {m['trainable_tensors']} ({m['gradient_bytes'] / MIB:.2f} MiB of gradients a step); "
               + ("every rank counted the same and ended with the same parameters" if m["ranks_agree"]
                  else "THE RANKS DISAGREE with this count or with each other"),
               "", f"memory per rank, step {MEMORY_STEP} (MiB; each category at its largest, measured beside predicted"
               + ("; activations have no prediction for a model the lab did not build"
                  if self.memory[("activations", "predicted")].isna().any() else "") + "):",
               self.memory.to_string(), ""]
        rule = self.bucket_rule
        out += [f"buckets DDP built after its rebuild ({len(self.buckets)}, cap "
                f"{'default 25 MiB, first 1 MiB' if s['bucket_cap_mb'] is None else str(s['bucket_cap_mb']) + ' MiB'}), "
                f"in launch order:", self.buckets.round(3).to_string(),
                f"the last bucket launched holds {len(self.last_bucket)} tensors: {_names(self.last_bucket)}",
                "DDP's rule on the ready order it saw in step 0 gives " + (
                    "exactly these buckets" if rule["matches"] else
                    f"other buckets ({rule['rule_counts']} tensors per bucket against {rule['observed_counts']})"), ""]
        if len(self.ready_order):
            swaps = int(self.ready_order["swapped_within_module"].sum())
            out += [f"ready order against reverse source order: {len(self.ready_order)} of {m['trainable_tensors']} "
                    f"gradients are not where reverse source order puts them ({swaps} of them only swapped places with "
                    f"the other parameter of their module, a weight and its bias):", self.ready_order.to_string(), ""]
        else:
            out += ["ready order: exactly the reverse of the source order", ""]
        out += [f"communication: {c['payload_bytes'] / MIB:.3f} MiB of gradients all-reduced a step; each rank wrote "
                f"{c['written_bytes_per_rank'] / MIB:.3f} MiB, the ring formula 2(D-1)/D x payload gives "
                f"{c['ring_formula_bytes'] / MIB:.3f} MiB (ratio {c['written_over_formula']:.3f})",
                f"compute against communication: forward+backward alone {k['compute_ms']:.1f} ms (min "
                f"{k['compute_ms_min']:.1f}, max {k['compute_ms_max']:.1f}); the all-reduce of the whole gradient "
                f"{k['allreduce_ms']:.1f} ms measured ({k['allreduce_ms_line']:.1f} ms on the fitted line): ratio "
                f"{k['compute_to_comm']:.2f}", _overlap_bound(k, self.buckets["mib"].iloc[-1]), "",
                *([self.compiled.text(), ""] if self.compiled is not None else []),
                "runs: " + ", ".join(f"{k} {rundir.shown(v)}" for k, v in self.paths.items())]
        return "\n".join(out)


def _overlap_bound(k: dict, last_mib: float) -> str:
    """What the compute-to-communication ratio can and cannot say: a bound, never a promise of overlap."""
    tail = k["last_bucket_ms_line"]
    floor = max(tail, k["allreduce_ms_line"] - k["compute_ms"])
    said = ("compute outlasts the all-reduce, which is only what overlap needs, not proof that it happens"
            if k["compute_to_comm"] > 1 else "the all-reduce outlasts compute: no overlap can hide all of it")
    return (f"what the ratio means: {said}. Even perfect overlap leaves at least {floor:.1f} ms exposed: the last bucket "
            f"({last_mib:.3f} MiB, {tail:.1f} ms on the fitted line) can start only once backward's compute has ended"
            + (f", and {k['allreduce_ms_line'] - k['compute_ms']:.1f} ms of all-reduce outlast compute" if floor > tail else "")
            + ". Whether the other buckets hide on this machine a ratio cannot say (on shared CPU cores their all-reduces "
            "slow backward instead): `ddplab tune-buckets` measures it on paired steps.")


def _names(names: list[str], shown: int = 6) -> str:
    if len(names) <= shown:
        return ", ".join(names)
    return ", ".join(names[:shown // 2]) + f", ... ({len(names) - shown} more), " + ", ".join(names[-(shown // 2):])


def _rule(exp, counted: Counted, rank0, observed) -> dict:
    """DDP's bucketing rule (predict.buckets.ddp_plan) on rank 0's step-0 ready order, which DDP's
    rebuild follows, with this run's caps and the sizes counted here: does it give the observed buckets?"""
    ready = rank0.steps[0].ready_ms()
    grads = predict.buckets.grads_in_ready_order([n for n, _ in ready], [counted.sizes[n] for n, _ in ready],
                                           [t for _, t in ready])
    plan = rule_for(grads, exp.bucket_cap_mb)
    return {"matches": plan == observed, "rule_counts": [len(b) for b in plan],
            "observed_counts": [len(b) for b in observed]}


__all__ = ["ModelAudit", "audit_model"]
