"""Tables of tensor parallelism (notebook 09): the split layer against the dense one, the collectives
counted against Megatron's formula (`predict/tensor_parallel.py`), step times of the dense, split and
DDP layer, and the dp x tp mesh's groups and what each ran; with the chapter's checks
`verify_tp_matches_dense`, `verify_tp_collectives` and `verify_mesh_matches_dense`. Every number is
read from the ranks' records (`spec/tensor_parallel.py`)."""

from __future__ import annotations

import pandas as pd

from .. import claims, predict, verify
from .stats import round_summary
from .reads import reading


# relative to the largest dense value of the same quantity: float32 sums in another order are off by
# ~1e-7 of it (errors grow with the batch and the sequence, and so does the scale); a mis-split layer
# by order 1
TOLERANCE = 1e-5


def _layer_runs(runs) -> list:
    runs = [r for r in (runs if isinstance(runs, (list, tuple)) else [runs]) if r.spec.task.dp == 1]
    if not runs:
        raise ValueError("no tensor-parallel check among these runs (they are dp x tp meshes): use mesh_groups()")
    return runs


def _layer(rank, name: str):
    return next(x for x in rank.result.layers if x.layer == name)


QUANTITIES = {"output": ("output_max_abs", "output_max_abs_error"),
              "input_grad": ("input_grad_max_abs", "input_grad_max_abs_error"),
              "param_grad": ("param_grad_max_abs", "param_grad_max_abs_error")}


def _worst(x, attr: str) -> float:
    v = getattr(x, attr)
    return max(v.values()) if isinstance(v, dict) else v


@reading(runs="tensor-parallel", either=("runs",))
def equality(runs, tolerance: float = TOLERANCE) -> pd.DataFrame:
    """Per run and layer, the largest error over the ranks of the split layer against the dense one:
    its output, the input's gradient and the parameters' gathered gradients (`*_error`, absolute),
    each beside the dense value's largest magnitude (`*_max_abs`, its scale); `rel_error` is the
    largest of error / scale, and `matches_dense` says it is below `tolerance`."""
    rows = []
    for run in _layer_runs(runs):
        for name in run.spec.task.layers:
            per_rank = [_layer(r, name) for r in run.ranks]
            row = {"run": run.spec.name, "layer": name, "tp": run.ranks[0].result.tp}
            rel = []
            for quantity, (scale, error) in QUANTITIES.items():
                row[f"{quantity}_max_abs"] = max(_worst(x, scale) for x in per_rank)
                row[f"{quantity}_error"] = max(_worst(x, error) for x in per_rank)
                rel.append(row[f"{quantity}_error"] / row[f"{quantity}_max_abs"] if row[f"{quantity}_max_abs"]
                           else float("inf") if row[f"{quantity}_error"] else 0.0)
            rows.append({**row, "rel_error": max(rel), "params": per_rank[0].params,
                         "local_params": [x.local_params for x in per_rank]})
    df = pd.DataFrame(rows).set_index(["run", "layer"])
    df["matches_dense"] = df["rel_error"] < tolerance
    return df


@reading(runs="tensor-parallel", either=("runs",))
def verify_tp_matches_dense(runs, layers=None, tolerance: float = TOLERANCE) -> None:
    """Notebook 09's check: on every rank, the split layer's output, input gradient and gathered
    parameter gradients equal the dense layer's, each within `tolerance` x the dense value's largest
    magnitude (float32 summed in another order). `layers`: which layers to check (default: every
    layer of the runs)."""
    table = equality(runs, tolerance)
    if layers is not None:
        table = table[table.index.get_level_values("layer").isin(list(layers))]
        if table.empty:
            raise ValueError(f"none of the layers {list(layers)!r} is in these runs")
    worst = table["rel_error"]
    where = ", ".join(f"{layer} on tp={table.loc[(run, layer), 'tp']}" for run, layer in table.index)
    bad = [f"{layer} on tp={table.loc[(run, layer), 'tp']} off by {worst[(run, layer)]:.3g} of the dense scale"
           for run, layer in table.index if not worst[(run, layer)] < tolerance]
    verify.that(f"the split layer equals the dense one in output and gradients ({where})", not bad,
                seen="; ".join(bad) if bad else f"at most {worst.max():.2g} of the dense values' scale off",
                expected=f"every error < {tolerance:g} x the dense value's largest magnitude")


@reading(runs="tensor-parallel", either=("runs",))
def collectives(runs) -> pd.DataFrame:
    """Per run and layer: all-reduces per forward and backward as torch's CommDebugMode counted them
    (the same on every rank, or the column says `None`) and as the formula says, the bytes of each
    all-reduce as the ranks logged them against b x t x d x 4, the ring bytes per rank of a step, and
    DDP's gradient all-reduce of the same layer (its buckets, measured) against parameters x 4."""
    rows = []
    for run in _layer_runs(runs):
        e = run.spec
        for name in e.task.layers:
            per_rank = [_layer(r, name) for r in run.ranks]
            counted = {phase: {x.module_counts["Global"][phase].get("all_reduce", 0) for x in per_rank}
                       for phase in ("forward", "backward")}
            logged = {c.bytes for x in per_rank for c in x.collectives}
            other_ops = sorted({op for x in per_rank for ph in x.module_counts["Global"].values() for op in ph}
                               - {"all_reduce"})
            formula = predict.tensor_parallel.step_comm(name, e.local_batch, e.seq_len, e.d_model, run.ranks[0].result.tp)
            ddp = {sum(x.ddp_bucket_bytes) for x in per_rank}
            rows.append({"run": e.name, "layer": name, "tp": run.ranks[0].result.tp,
                         "forward_all_reduces": counted["forward"].pop() if len(counted["forward"]) == 1 else None,
                         "formula_forward": formula["tp_forward_all_reduces"],
                         "backward_all_reduces": counted["backward"].pop() if len(counted["backward"]) == 1 else None,
                         "formula_backward": formula["tp_backward_all_reduces"],
                         "other_collectives": other_ops,
                         "all_reduce_bytes": logged.pop() if len(logged) == 1 else None,
                         "formula_bytes": formula["tp_all_reduce_bytes"],
                         "groups": sorted({tuple(c.group) for x in per_rank for c in x.collectives}),
                         "tp_step_ring_bytes_per_rank": formula["tp_step_ring_bytes_per_rank"],
                         "ddp_all_reduce_bytes": ddp.pop() if len(ddp) == 1 else None,
                         "formula_ddp_bytes": formula["ddp_all_reduce_bytes"]})
    return pd.DataFrame(rows).set_index(["run", "layer"])


@reading(run="tensor-parallel")
def module_counts(run, layer: str) -> pd.DataFrame:
    """Per module of one split layer, the collectives torch's CommDebugMode counted in forward and in
    backward (a parent module includes its children's; "Global" is the whole step), as rank 0 saw
    them; `same_on_every_rank` says whether every rank counted the same."""
    run = _layer_runs(run)[0]
    counts = [_layer(r, layer).module_counts for r in run.ranks]
    rows = [{"module": module, "forward": dict(phases["forward"]), "backward": dict(phases["backward"]),
             "same_on_every_rank": all(c.get(module) == phases for c in counts)}
            for module, phases in counts[0].items()]
    return pd.DataFrame(rows).set_index("module")


@reading(runs="tensor-parallel", either=("runs",))
def verify_tp_collectives(runs) -> None:
    """Notebook 09's check: every split layer ran exactly Megatron's all-reduces (one per sublayer in
    forward, one in backward, nothing else), each of b x t x d x 4 bytes over its whole tp group, and
    DDP's gradient all-reduce carried parameters x 4 bytes."""
    table = collectives(runs)
    misses = []
    for (run, layer), row in table.iterrows():
        tp = row["tp"]
        for seen, due, what in ((row["forward_all_reduces"], row["formula_forward"], "forward all-reduces"),
                                (row["backward_all_reduces"], row["formula_backward"], "backward all-reduces"),
                                (row["all_reduce_bytes"], row["formula_bytes"], "bytes per all-reduce"),
                                (row["ddp_all_reduce_bytes"], row["formula_ddp_bytes"], "DDP gradient bytes")):
            if seen != due:
                misses.append(f"{layer} (tp={tp}): {what} {seen} where {due} was due")
        if row["other_collectives"]:
            misses.append(f"{layer} (tp={tp}): also ran {', '.join(row['other_collectives'])}")
        if len(row["groups"]) != 1 or len(row["groups"][0]) != tp:
            misses.append(f"{layer} (tp={tp}): all-reduces over groups {row['groups']}, not one group of {tp}")
    verify.that(f"each split layer's collectives are Megatron's formula ({len(table)} layer runs)", not misses,
                seen="; ".join(misses) if misses else
                "; ".join(f"{layer} tp={row['tp']}: {row['forward_all_reduces']}+{row['backward_all_reduces']} "
                          f"all-reduces of {row['all_reduce_bytes']} B" for (_, layer), row in table.iterrows()),
                expected="the counts and bytes of predict.tensor_parallel")


def _stat(values: list[float], per_round: int) -> tuple[float, float, float, float]:
    """Median of round medians, min, max and spread (`stats.round_summary`) of steps, `per_round` a round."""
    rounds = {k: values[i:i + per_round] for k, i in enumerate(range(0, len(values), per_round))}
    median, spread = round_summary(rounds)
    return median, min(values), max(values), spread


def _slowest(per_rank: list[list[float]]) -> list[float]:
    """Per step, the slowest rank's value (a step with collectives ends when the last rank does)."""
    return [max(v) for v in zip(*per_rank)]


@reading(runs="tensor-parallel", either=("runs",))
def timing(runs) -> pd.DataFrame:
    """Per run, layer and way of running it ("dense": the whole layer on one rank, no communication;
    "tensor parallel": every rank 1/tp of it; "ddp": every rank the whole layer on 1/world_size of the
    batch): the step time (forward + backward, the slowest rank per step): `step_ms` the median of the
    interleaved rounds' medians, `step_ms_spread` their spread (`stats.round_summary`), min and
    max over every timed step; and the time spent in communication: tensor parallelism's collectives
    on the critical path (the rank blocked in them; separate traced steps), DDP's all-reduce from
    launch to done (`comm_ms`), the part of it in flight while backward still computed
    (`comm_during_backward_ms`; zero with one bucket: it launches when the last gradient is ready)
    and the part of backward after the last gradient was ready (`exposed_ms`, its tail). `verdict`: is the
    split slower than the dense layer here, judged on the `paired_steps` (`claims.noted`), or too few steps
    to judge (under `claims.min_rounds`); `ideal_ms`: the dense step over tp (the split, were it free)."""
    rows = []
    for run in _layer_runs(runs):
        per_round = run.spec.task.steps_per_round
        for name in run.spec.task.layers:
            per_rank = [_layer(r, name) for r in run.ranks]
            steps, medians = {}, {}
            for way, attr in (("dense", "dense"), ("tensor parallel", "tp"), ("ddp", "ddp")):
                times = [getattr(x, attr) for x in per_rank]
                step = _slowest([[f + b for f, b in zip(t.forward_ms, t.backward_ms)] for t in times])
                steps[way] = step
                med, lo, hi, spread = _stat(step, per_round)
                medians[way] = med
                row = {"run": run.spec.name, "layer": name, "way": way, "ranks": run.world_size,
                       "cpus": min(r.result.cpus for r in run.ranks), "rounds": run.spec.task.rounds,
                       "step_ms": med, "step_ms_spread": spread, "step_ms_min": lo, "step_ms_max": hi}
                if attr != "dense":   # tp: the collectives on the critical path; ddp: the all-reduce in flight
                    comm = _slowest([[f + b for f, b in zip(t.comm_forward_ms, t.comm_backward_ms)] if attr == "tp"
                                     else t.comm_backward_ms for t in times])
                    row.update(comm_ms=_stat(comm, per_round)[0], comm_ms_min=min(comm), comm_ms_max=max(comm))
                if attr == "tp":
                    fwd = _slowest([t.comm_forward_ms for t in times])
                    row.update(comm_forward_ms=_stat(fwd, per_round)[0], on_critical_path=True,
                               ideal_ms=medians["dense"] / run.ranks[0].result.tp)
                    tp_row = row
                elif attr == "ddp":
                    row.update(exposed_ms=_stat(_slowest([t.exposed_ms for t in times]), per_round)[0],
                               comm_during_backward_ms=_stat(_slowest([t.during_backward_ms for t in times]),
                                                             per_round)[0],
                               buckets=len(per_rank[0].ddp_bucket_bytes), on_critical_path=False)
                rows.append(row)
            dense, tp = steps["dense"], steps["tensor parallel"]
            # the split step against the dense one, step by step (both ran in every round): a finding of this
            # machine (on 2 shared cores the split is slower; on GPUs it need not be), counted by claims.this_run
            verdict = claims.paired(f"{run.spec.name}, {name}: the split step is slower than the dense one (per step)",
                                    tp, dense, above=0.0)
            tp_row["reference"] = claims.noted(verdict) if verdict.n >= claims.min_rounds(verdict.alpha) else ""
            tp_row["paired_steps"] = verdict.n
            tp_row["verdict"] = TOO_FEW if verdict.n < claims.min_rounds(verdict.alpha) else VERDICT[verdict.outcome]
    return pd.DataFrame(rows).set_index(["run", "layer", "way"])


VERDICT = {"holds": "slower than dense", "contradicted": "faster than dense",
           "cannot resolve": "not told apart from dense"}
TOO_FEW = "not judged against dense"   # under claims.min_rounds paired steps the sign test judges nothing


@reading(runs="tensor-parallel", either=("runs",))
def timing_sentences(runs) -> list[str]:
    """One sentence per layer and run, read from `timing`: the split step against the dense one and
    what of it the collectives took; for a notebook to print (nothing here is fixed text)."""
    table = timing(runs)
    out = []
    for (run, layer), part in table.groupby(level=["run", "layer"], sort=False):
        dense, tp, ddp = (part.xs(w, level="way").iloc[0] for w in ("dense", "tensor parallel", "ddp"))
        shared = f" sharing {tp['cpus']} cores" if tp["ranks"] > tp["cpus"] else ""
        n, need = int(tp["paired_steps"]), claims.min_rounds()
        judged = f"{tp['verdict']} over {n} paired steps" + (f" (a reference run: {tp['reference']})" if tp["reference"]
                                                             else "") if tp["verdict"] != TOO_FEW else \
            f"{tp['verdict']} ({n} paired steps, under the {need} a verdict needs)"
        out.append(f"{run}, {layer}: the split step took {tp['step_ms']:.2f} ms ({tp['step_ms_min']:.2f}-"
                   f"{tp['step_ms_max']:.2f}) on {tp['ranks']} ranks{shared}, the dense one {dense['step_ms']:.2f} ms "
                   f"({dense['step_ms_min']:.2f}-{dense['step_ms_max']:.2f}): {judged}; {tp['comm_ms']:.2f} ms of the "
                   f"split step blocked in all-reduces on the critical path; the rest (about {max(0.0, tp['step_ms'] - tp['comm_ms']):.2f} ms) is "
                   f"compute and DTensor's own work, where a free split would take dense / tp = {tp['ideal_ms']:.2f} ms; "
                   f"DDP's all-reduce took {ddp['comm_ms']:.2f} ms, {ddp['comm_during_backward_ms']:.2f} ms of it in flight "
                   f"while backward still computed")
    return out


@reading(runs="tensor-parallel", either=("runs",))
def gpu_prediction(runs, busbw_gb_s: float = 370.0, latency_us: float = 20.0) -> pd.DataFrame:
    """A model's prediction, not a measurement: per run and layer, the all-reduce time of a step at a
    GPU link's bus bandwidth (default: 8 x H100 NVLink ring, about 370 GB/s; NCCL's small-message
    latency is about 6-50 us, docs/performance-anchors.md, "Published GPU figures"), tensor
    parallelism's on the critical path beside DDP's, which can hide behind backward. The shapes are the runs' own."""
    rows = []
    for run in _layer_runs(runs):
        e, tp = run.spec, run.ranks[0].result.tp
        for name in e.task.layers:
            c = predict.tensor_parallel.step_comm(name, e.local_batch, e.seq_len, e.d_model, tp)
            calls = c["tp_forward_all_reduces"] + c["tp_backward_all_reduces"]
            one = predict.tensor_parallel.predicted_all_reduce_ms(c["tp_all_reduce_bytes"], tp, busbw_gb_s * 1e9, latency_us / 1e3)
            rows.append({"run": e.name, "layer": name, "tp": tp, "what": f"model at {busbw_gb_s:g} GB/s busbw, "
                         f"{latency_us:g} us latency", "predicted_tp_critical_path_us": calls * one * 1e3,
                         "predicted_ddp_all_reduce_us": 1e3 * predict.tensor_parallel.predicted_all_reduce_ms(
                             c["ddp_all_reduce_bytes"], tp, busbw_gb_s * 1e9, latency_us / 1e3)})
    return pd.DataFrame(rows).set_index(["run", "layer"])


@reading(run="tensor-parallel")
def mesh_groups(run) -> pd.DataFrame:
    """Per rank of a dp x tp mesh: its coordinates, the ranks of its tp group and of its dp group,
    and per group what it ran in one training step of each layer (op, phase, bytes)."""
    if run.spec.task.dp == 1:
        raise ValueError(f"run {run.spec.name!r} has dp=1: no mesh (use equality/collectives/timing)")
    rows = []
    for r in run.ranks:
        res = r.result
        coordinate = next((i, row.index(r.rank)) for i, row in enumerate(res.mesh) if r.rank in row)
        for group, kind in ((res.tp_group, "tp"), (res.dp_group, "dp")):
            ran = [f"{m.layer}: {c.phase} {c.op} {c.bytes} B" for m in res.mesh_layers
                   for c in m.collectives if c.group == group]
            rows.append({"rank": r.rank, "dp, tp": coordinate, "group": kind, "ranks": group,
                         "collectives": len(ran), "bytes": sum(c.bytes for m in res.mesh_layers
                                                               for c in m.collectives if c.group == group),
                         "ran": ran})
    return pd.DataFrame(rows).set_index(["rank", "group"])


@reading(run="tensor-parallel")
def mesh_check(run) -> pd.DataFrame:
    """Per layer of a mesh run: the largest parameter error against the dense layer trained on the
    global batch (after the last step, over every rank; `param_error` absolute, `rel_error` over the
    dense parameters' largest magnitude), how far the steps moved the dense parameters (`moved`, the
    largest change, and `moved_rel`: a wrong gradient average would be off by about that much), and
    each step's loss, mesh beside dense."""
    if run.spec.task.dp == 1:
        raise ValueError(f"run {run.spec.name!r} has dp=1: no mesh")
    rows = []
    for name in run.spec.task.layers:
        per_rank = [next(m for m in r.result.mesh_layers if m.layer == name) for r in run.ranks]
        scale = max(m.param_max_abs for m in per_rank)
        error = max(max(m.param_max_abs_error.values()) for m in per_rank)
        moved = max(m.update_max_abs for m in per_rank)
        rows.append({"layer": name, "steps": run.spec.steps, "param_max_abs": scale, "param_error": error,
                     "rel_error": error / scale, "moved": moved, "moved_rel": moved / scale,
                     "losses": per_rank[0].losses, "dense_losses": per_rank[0].dense_losses,
                     "loss_error": max(abs(a - b) for m in per_rank for a, b in zip(m.losses, m.dense_losses))})
    return pd.DataFrame(rows).set_index("layer")


@reading(run="tensor-parallel")
def verify_mesh_matches_dense(run, tolerance: float = TOLERANCE) -> None:
    """Notebook 09's check: after `steps` SGD steps on the dp x tp mesh, every rank's (gathered)
    parameters equal the dense layer trained on the global batch within `tolerance` x the largest
    dense parameter; and the steps moved the parameters by over 10 x that, so that a wrong gradient
    average (one dp group's gradient, or the sum instead of the mean) would show."""
    table = mesh_check(run)
    e = run.spec
    where = f"{e.task.dp} x {e.world_size // e.task.dp} mesh (dp x tp) after {e.steps} step(s)"
    still = [f"{layer} moved only {row['moved_rel']:.2g}" for layer, row in table.iterrows()
             if not row["moved_rel"] > 10 * tolerance]
    verify.that(f"{where}: training moved every layer's parameters beyond the tolerance", not still,
                seen="; ".join(still) if still else f"at least {table['moved_rel'].min():.2g} of their scale",
                expected=f"> {10 * tolerance:g} of the largest parameter")
    verify.below(f"{where} = the dense layer trained on the global batch ({', '.join(table.index)}; "
                 f"error over the largest parameter)", table["rel_error"].tolist(), tolerance)
