"""Tables of FSDP2's memory over one step (notebook 09): the units and their padded shards, the measured
peak of every configuration and rank beside the naive estimate "checkpoint / world size" and beside
the predicted peak (`predict/fsdp_memory.py`), one configuration's timeline sample by sample, and ZeRO's
stages for any model size (`predict/zero.py`) and measured on one model (`zero_measured`). The chapter's
checks: `verify_fsdp_peak_predicted`,
`verify_reshard_frees_gathered_units` and `verify_zero_exact`. Measured numbers come
from the ranks' records (`record/fsdp_memory.py`), predictions from the spec alone."""

from __future__ import annotations

import pandas as pd

from .. import verify
from .. import predict
from ..predict import zero
from ..predict.memory import state_bytes
from ..spec.fsdp_memory import SAMPLE_CATEGORIES
from ..units import DTYPE_BYTES, MIB, ms_after
from .reads import reading, reading_no_run



def _configs(run) -> list[tuple[bool, bool]]:
    return [(c.reshard_after_forward, c.prefetch) for c in run.ranks[0].result.configs]


@reading_no_run
def config_label(reshard_after_forward: bool, prefetch: bool) -> str:
    """'reshard, prefetch' / 'keep gathered, no prefetch': a configuration in words."""
    return f"{'reshard' if reshard_after_forward else 'keep gathered'}, {'prefetch' if prefetch else 'no prefetch'}"


def _config(run, rank: int, reshard_after_forward: bool, prefetch: bool):
    for c in run.ranks[rank].result.configs:
        if (c.reshard_after_forward, c.prefetch) == (reshard_after_forward, prefetch):
            return c
    raise ValueError(f"run {run.spec.name!r} has no configuration reshard_after_forward={reshard_after_forward}, "
                     f"prefetch={prefetch}; it has {_configs(run)}")


@reading(run="fsdp-memory")
def units(run, rank: int = 0) -> pd.DataFrame:
    """Per FSDP2 unit on `rank`: its parameters' dim-0 sizes and elements, the shard it stores (measured,
    and predicted with ceil(dim0 / world_size) rows each), the padding that adds, and its size gathered."""
    exp, rec = run.spec, run.ranks[rank].result
    w, e = exp.world_size, DTYPE_BYTES[exp.dtype]
    rows = []
    for u, p in zip(rec.units, predict.fsdp_memory.units(exp)):
        rows.append({"unit": u.name, "dim0": u.dim0, "numel": sum(u.numels), "shard_bytes": u.shard_bytes,
                     "predicted_shard_bytes": predict.fsdp_memory.shard_bytes(p, w, e),
                     "padding_bytes": u.shard_bytes * w - sum(u.numels) * e, "gathered_bytes": u.gathered_bytes})
    return pd.DataFrame(rows).set_index("unit")


@reading(run="fsdp-memory")
def shard_estimate_bytes(run) -> float:
    """The naive per-rank estimate: a full checkpoint (parameters + optimizer state, measured: the
    parameters' bytes and every rank's optimizer state summed) divided by the world size."""
    optimizer = sum(r.result.configs[0].samples[-1].bytes["optimizer_state"] for r in run.ranks)
    return (run.ranks[0].result.parameter_bytes + optimizer) / run.spec.world_size


def _where(event: str, unit: int | None, names: list[str]) -> str:
    return f"{event} {names[unit]}" if unit is not None else event


@reading_no_run
def measured_peak_at(config, names: list[str]) -> str:
    """Where in the step a configuration's measured peak fell: "at <sample>" when a sample saw it, else
    "before <sample>" (between that sample and the previous one, where the tracker saw it)."""
    i = max(range(len(config.samples)), key=lambda i: config.samples[i].peak_since_last)
    s = config.samples[i]
    return f"{'at' if s.total >= config.peak_bytes else 'before'} {_where(s.event, s.unit, names)}"


def _forward(samples) -> list:
    """The samples from the step's start until the loss (the forward)."""
    loss = next(i for i, s in enumerate(samples) if (s["event"] if isinstance(s, dict) else s.event) == "loss")
    return samples[:loss + 1]


@reading_no_run
def forward_comm_bytes(config) -> int:
    """The most in FSDP2's all-gather buffers at a forward sample, measured: one unit's flat output
    without prefetch, two (this unit's and the next one's) with it."""
    return max(s.bytes["comm_buffers"] for s in _forward(config.samples))


@reading(run="fsdp-memory")
def peaks(run, predictor=None) -> pd.DataFrame:
    """Per configuration and rank: the measured peak and where it fell (`at`), the persistent sharded
    state (parameters, gradients and optimizer state after the step), the naive estimate checkpoint /
    world size, the predicted peak (`predictor(exp, reshard_after_forward, prefetch, rank)`, by default
    `predict.fsdp_memory.peak`) and where the model puts it (`predicted_at`), all in MiB, and the ratios: peak
    over estimate, predicted over measured. The step's peak falls in backward, where FSDP2 prefetches
    the previous unit with or without explicit prefetch, so prefetch does not move it. It shows in the
    forward: `forward_comm_mib` (the most in all-gather buffers at a forward sample, measured; and
    `predicted_forward_comm_mib`) holds one more unit with prefetch, while `forward_peak_mib` (the most
    live in the forward, measured) barely moves: without prefetch the same two buffers coexist briefly
    when the next unit's all-gather starts. On CUDA the
    allocator's own peak (`torch.cuda.max_memory_allocated` over the step) is `cuda_peak_mib` beside
    the tally; the model is validated against the tally, on the CPU."""
    exp, estimate = run.spec, shard_estimate_bytes(run)
    names = [u.name for u in run.ranks[0].result.units]
    rows = []
    for r in run.ranks:
        for c in r.result.configs:
            end = c.samples[-1].bytes
            walk = predict.fsdp_memory.timeline(exp, c.reshard_after_forward, c.prefetch, r.rank)
            top = max(walk, key=lambda m: m["total"])   # predict.fsdp_memory.peak_moment, from the walk at hand
            predicted = (top["total"] if predictor is None
                         else predictor(exp, c.reshard_after_forward, c.prefetch, r.rank))
            row = {"configuration": config_label(c.reshard_after_forward, c.prefetch), "rank": r.rank,
                   "reshard_after_forward": c.reshard_after_forward, "prefetch": c.prefetch,
                   "measured_peak_mib": c.peak_bytes / MIB, "at": measured_peak_at(c, names),
                   "sharded_state_mib": sum(end[k] for k in predict.fsdp_memory.STATE) / MIB,
                   "shard_estimate_mib": estimate / MIB, "predicted_peak_mib": predicted / MIB,
                   "predicted_at": _where(top["event"], top["unit"], names),
                   "forward_peak_mib": max(s.peak_since_last for s in _forward(c.samples)) / MIB,
                   "forward_comm_mib": forward_comm_bytes(c) / MIB,
                   "predicted_forward_comm_mib": max(m["bytes"]["comm_buffers"] for m in _forward(walk)
                                                     if m["sampled"]) / MIB,
                   "peak_over_estimate": c.peak_bytes / estimate,
                   "predicted_over_measured": predicted / c.peak_bytes}
            if getattr(c, "cuda_peak_bytes", None) is not None:
                row["cuda_peak_mib"] = c.cuda_peak_bytes / MIB
            rows.append(row)
    return pd.DataFrame(rows).set_index(["configuration", "rank"]).round(3)


@reading(run="fsdp-memory")
def peak_breakdown(run, rank: int = 0) -> pd.DataFrame:
    """Per configuration: what is alive at the predicted peak (MiB by category, `predict.fsdp_memory.peak_moment`),
    where in the step it falls, and the measured peak beside it."""
    names = [u.name for u in predict.fsdp_memory.units(run.spec)]
    rows = []
    for reshard, prefetch in _configs(run):
        m = predict.fsdp_memory.peak_moment(run.spec, reshard, prefetch, rank)
        rows.append({"configuration": config_label(reshard, prefetch), "at": _where(m["event"], m["unit"], names),
                     **{k: v / MIB for k, v in m["bytes"].items() if k != "other"},
                     "predicted_peak_mib": m["total"] / MIB,
                     "measured_peak_mib": _config(run, rank, reshard, prefetch).peak_bytes / MIB})
    return pd.DataFrame(rows).set_index("configuration").round(3)


def _aligned(run, config, predicted: list[dict], names: list[str], rank: int) -> None:
    """The recorded samples and the model's sampled moments must be the same (event, unit) sequence, or
    the timeline would set numbers of different moments side by side: a ValueError names the first
    difference (torch's hook order, or the model's walk, changed)."""
    seen = [(s.event, s.unit) for s in config.samples]
    due = [(m["event"], m["unit"]) for m in predicted]
    if seen == due:
        return
    i = next((i for i, (a, b) in enumerate(zip(seen, due)) if a != b), min(len(seen), len(due)))

    def at(seq):
        return _where(*seq[i], names) if i < len(seq) else "(nothing: the sequence ends)"
    raise ValueError(f"run {run.spec.name!r}, {config_label(config.reshard_after_forward, config.prefetch)}, rank "
                     f"{rank}: the recorded samples ({len(seen)}) and predict.fsdp_memory.timeline's sampled moments "
                     f"({len(due)}) differ first at sample {i}: recorded {at(seen)}, predicted {at(due)}")


@reading(run="fsdp-memory")
def timeline(run, reshard_after_forward: bool = True, prefetch: bool = False, rank: int = 0) -> pd.DataFrame:
    """One configuration's samples on `rank`, in order: the event and unit, ms since the step's start,
    MiB per category, the total, the most live since the previous sample, the gathered units, and the
    predicted total at the same moment (`predict.fsdp_memory.timeline`); a ValueError if the recorded and the
    predicted moments are not the same sequence."""
    c = _config(run, rank, reshard_after_forward, prefetch)
    names = [u.name for u in run.ranks[rank].result.units]
    predicted = [m for m in predict.fsdp_memory.timeline(run.spec, reshard_after_forward, prefetch, rank) if m["sampled"]]
    _aligned(run, c, predicted, names, rank)
    t0 = c.samples[0].t_ns
    rows = []
    for s, p in zip(c.samples, predicted):
        rows.append({"event": s.event, "unit": names[s.unit] if s.unit is not None else "",
                     "t_ms": ms_after(s.t_ns, t0), **{k: s.bytes[k] / MIB for k in SAMPLE_CATEGORIES},
                     "total_mib": s.total / MIB, "peak_since_last_mib": s.peak_since_last / MIB,
                     "predicted_total_mib": p["total"] / MIB, "gathered_units": [names[i] for i in s.gathered_units]})
    df = pd.DataFrame(rows)
    df.index.name = "sample"
    return df.round(3)


@reading(run="fsdp-memory")
def gather_counts(run, rank: int = 0) -> pd.DataFrame:
    """Per configuration (rows) and unit (columns): how many times `rank` all-gathered the unit in the
    recorded step, counted from the timeline as the samples where it is gathered and was not at the
    sample before (with resharding a block is gathered for its forward and again for its backward)."""
    rows = {}
    for reshard, prefetch in _configs(run):
        counts, before = {}, set()
        for units in timeline(run, reshard, prefetch, rank)["gathered_units"]:
            for u in set(units) - before:
                counts[u] = counts.get(u, 0) + 1
            before = set(units)
        rows[config_label(reshard, prefetch)] = counts
    names = [u.name for u in run.ranks[rank].result.units]
    return pd.DataFrame.from_dict(rows, orient="index").reindex(columns=names).fillna(0).astype(int)


@reading(run="fsdp-memory")
def verify_fsdp_peak_predicted(run, tolerance: float = 0.10, predictor=None) -> None:
    """Notebook 09's check: for every configuration and rank, the predicted peak is within `tolerance`
    (relative) of the measured peak. `predictor` as in `peaks`; raises `verify.CheckFailed` naming the
    worst configuration and rank."""
    table = peaks(run, predictor)
    errors = (table["predicted_over_measured"] - 1).abs()
    worst = errors.idxmax()
    claim = (f"{run.spec.name}: the predicted FSDP2 peak is within {tolerance:.0%} of the measured peak "
             f"for all {len(table)} configurations x ranks")
    seen = (f"worst {errors.max():.1%} off ({worst[0]}, rank {worst[1]}: predicted "
            f"{table.loc[worst, 'predicted_peak_mib']:.2f} MiB, measured {table.loc[worst, 'measured_peak_mib']:.2f} MiB)")
    verify.that(claim, bool((errors <= tolerance).all()), seen=seen, expected=f"every one within {tolerance:.0%}")


@reading(run="fsdp-memory")
def verify_reshard_frees_gathered_units(run, rank: int = 0) -> None:
    """Notebook 09's check, on the timeline: with reshard_after_forward=True every unit's gathered
    parameters are freed at its post-forward; with False every unit is still gathered when the loss is
    computed (all of them at once). Raises `verify.CheckFailed` naming the configuration and units."""
    names = [u.name for u in run.ranks[rank].result.units]
    problems, counts, checked = [], [], 0
    for c in run.ranks[rank].result.configs:
        label = config_label(c.reshard_after_forward, c.prefetch)
        if c.reshard_after_forward:
            after = [s for s in c.samples if s.event == "post-forward"]
            kept = [names[s.unit] for s in after if s.unit in s.gathered_units]
            counts.append(f"{label}: {len(kept)} of {len(after)} units still gathered after their forward")
            if kept or not after:
                problems.append(f"{label}: {', '.join(kept) or 'no post-forward sample'} still gathered after its forward")
        else:
            at_loss = next(s for s in c.samples if s.event == "loss")
            missing = [n for i, n in enumerate(names) if i not in at_loss.gathered_units]
            counts.append(f"{label}: {len(names) - len(missing)} of {len(names)} units gathered at the loss")
            if missing:
                problems.append(f"{label}: {', '.join(missing)} not gathered at the loss")
        checked += 1
    verify.that(f"{run.spec.name}: resharding frees each unit after its forward, keeping them holds all "
                f"{len(names)} units gathered at the loss (rank {rank}, {checked} configurations)", not problems,
                seen="; ".join(problems) or "; ".join(counts),
                expected=f"0 still gathered after their forward with resharding, {len(names)} of {len(names)} "
                         "at the loss kept gathered")


@reading_no_run
def zero_stages(psi: float, n_devices: int, precision: str = "mixed") -> pd.DataFrame:
    """ZeRO stage 0..3 per-device model state for `psi` parameters on `n_devices`, in GB (10**9 bytes):
    `predict.zero.zero_stages` as a table, one row per stage."""
    d = zero.zero_stages(psi, n_devices, precision)
    df = pd.DataFrame(d).set_index("stage")
    for k in ("parameters", "gradients", "optimizer_state", "total"):
        df[f"{k}_gb"] = df.pop(f"{k}_bytes") / zero.GB
    return df[["sharded", "parameters_gb", "gradients_gb", "optimizer_state_gb", "total_gb", "reduction"]]


_STAGE = {"none": 0, "zero1": 1, "fsdp2": 3}


@reading(runs="train", probes=("memory",))
def zero_measured(runs, step: int = 1) -> pd.DataFrame:
    """ZeRO stages on one model (`recipes.fsdp_memory.zero_stages_measured`: DDP = stage 0, ZeRO-1,
    FSDP2 = stage 3; fp32 Adam), per stage and rank: the model state each rank measured after optimizer
    step `step` (parameters + gradients + optimizer state; DDP's buckets left out), the exact prediction
    for this model (DDP and ZeRO-1: `predict.memory.state_bytes`, under ZeRO-1 with torch's whole-tensor
    partition, as `predict.zero.zero1_exact`; FSDP2: padded dim-0 shards, `predict.fsdp_memory.sharded_state`),
    and the paper's even split K Psi / N
    (`predict.zero.zero_state_bytes`, precision "fp32"), in bytes (exact integers, to compare with ==)
    and in MiB; `exact_minus_even_mib` is what the even split misses on each rank."""
    rows = []
    for run in runs:
        exp = run.spec
        if exp.task.kind != "train" or "memory" not in exp.probes or exp.sharding not in _STAGE:
            raise ValueError(f"run {exp.name!r}: zero_measured reads Train runs with the memory probe and "
                             f"sharding one of {', '.join(_STAGE)} (got task {exp.task.kind!r}, probes "
                             f"{exp.probes!r}, sharding {exp.sharding!r})")
        if exp.optimizer not in ("adam", "adamw"):
            raise ValueError(f"run {exp.name!r}: zero_measured compares with ZeRO's Adam accounting; "
                             f"Experiment.optimizer must be adam or adamw (got {exp.optimizer!r})")
        stage = _STAGE[exp.sharding]
        numels, trainable = run.ranks[0].result.memory.parameter_numels, run.ranks[0].result.memory.trainable
        psi = sum(numels)
        if not 0 <= step < len(run.ranks[0].result.memory.steps):
            raise ValueError(f"step: run {exp.name!r} recorded steps 0..{len(run.ranks[0].result.memory.steps) - 1} "
                             f"(got {step!r})")
        for r in run.ranks:
            p = r.result.memory.steps[step].phases["step"]
            measured = p["parameters"] + p["gradients"] + p["optimizer_state"]
            if stage == 3:
                exact = sum(predict.fsdp_memory.sharded_state(exp, r.rank).values())
            else:
                s = state_bytes(exp, numels or None, trainable or None, r.rank)
                exact = s["parameters"] + s["gradients"] + s["optimizer_state"]
            even = zero.zero_state_bytes(psi, exp.world_size, stage, "fp32")["total"]
            rows.append({"stage": stage, "sharding": exp.sharding, "rank": r.rank, "measured_bytes": int(measured),
                         "exact_bytes": int(exact), "even_bytes": even, "measured_mib": measured / MIB,
                         "exact_mib": exact / MIB, "even_mib": even / MIB, "exact_minus_even_mib": (exact - even) / MIB,
                         "measured_over_even": measured / even})
    return pd.DataFrame(rows).set_index(["stage", "rank"]).sort_index()


@reading(runs="train", probes=("memory",))
def verify_zero_exact(runs, predicted: str = "exact_bytes", step: int = 1) -> None:
    """Notebook 09's check: every rank's measured model state equals the prediction to the byte, at
    every stage; `predicted="even_bytes"` holds the paper's even split to the same standard (it fails
    under ZeRO-1 wherever whole tensors make the ranks uneven). Raises `verify.CheckFailed` naming the
    worst stage and rank."""
    t = zero_measured(runs, step)
    if predicted not in ("exact_bytes", "even_bytes"):
        raise ValueError(f"predicted: 'exact_bytes' or 'even_bytes' (got {predicted!r})")
    miss = (t["measured_bytes"] - t[predicted]).abs()
    worst = miss.idxmax()
    spread = t["exact_minus_even_mib"].abs().max()
    spread = f"{spread:.2f} MiB" if spread >= 0.01 else f"{spread * 2**20:.0f} B"
    verify.that(f"measured model state == {predicted.replace('_bytes', '')} prediction, to the byte, for all "
                f"{len(t)} stages x ranks (the even split is up to {spread} off on a rank)",
                bool((miss == 0).all()),
                seen=f"worst stage {worst[0]}, rank {worst[1]}: measured {int(t.loc[worst, 'measured_bytes'])} B, "
                     f"predicted {t.loc[worst, predicted]:.0f} B ({miss.max():.0f} B off)",
                expected="0 B off everywhere")
