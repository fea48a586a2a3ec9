"""Plans as tables: what one rank holds at a cluster's world size, each figure with its source, and the
ZeRO paper's formula beside it with its gap (what a formula misses). Used by notebook 12 and `ddplab plan`.
"""

from __future__ import annotations

import pandas as pd

from ..predict.plan import CLUSTERS, peak_label, step_estimate
from ..predict.zero import zero_state_bytes
from ..record.plan import CATEGORIES
from .reads import reading, reading_no_run

GIB = 1 << 30
STAGE = {"ddp": 0, "zero1": 1, "fsdp2": 3}
MODEL_STATE = ("parameters", "gradients", "optimizer_state")


@reading_no_run
def formula_bytes(plan) -> dict[str, float] | None:
    """The ZeRO paper's model state for this plan (fp32 parameters and gradients, Adam's 8 B of state a
    parameter, or half of each for bfloat16 with no master copy); None where it does not apply (SGD)."""
    spec = plan.spec
    if spec.optimizer == "sgd":
        return None
    row = zero_state_bytes(plan.record.parameters_total, spec.world_size, STAGE[spec.strategy], "fp32")
    scale = 0.5 if spec.dtype == "bfloat16" else 1.0
    return {c: row[c] * scale for c in MODEL_STATE}


@reading_no_run
def plan_table(plan) -> pd.DataFrame:
    """One plan: every category's bytes on rank 0 (GiB), where the figure came from, what makes the peak,
    and the formula's model state beside the traced one."""
    rec, formula = plan.record, formula_bytes(plan)
    rows = []
    for c in CATEGORIES:
        fig = rec.held[c]
        row = {"category": c, "GiB": round(fig.bytes / GIB, 3), "at the peak, GiB": round(rec.at_peak.get(c, 0) / GIB, 3),
               "source": fig.source if fig.bytes or rec.at_peak.get(c, 0) else "-", "formula, GiB": "", "formula's gap": ""}
        if formula is not None and c in formula:
            row["formula, GiB"] = round(formula[c] / GIB, 3)
            row["formula's gap"] = f"{(formula[c] - fig.bytes) / fig.bytes:+.1%}" if fig.bytes else "-"
        rows.append(row)
    rows.append({"category": f"peak ({rec.peak_phase})", "GiB": round(rec.peak_bytes / GIB, 3),
                 "at the peak, GiB": round(rec.peak_bytes / GIB, 3), "source": rec.peak_source, "formula, GiB": "",
                 "formula's gap": ""})
    return pd.DataFrame(rows).set_index("category")


UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": GIB}
PLAIN = {"comm_buffers": "gathered layers", "ddp_buckets": "DDP's buckets", "optimizer_state": "optimizer state"}


def _label(spec) -> str:
    """"fsdp2 (keep gathered) + checkpointing": the strategy and its options, as the tables name it."""
    return spec.strategy + ("" if spec.reshard_after_forward else " (keep gathered)") + \
        (" + checkpointing" if spec.checkpointing else "")


def _gap(plan) -> str:
    """The ZeRO paper's model state beside the traced one: "+1.2%" ((formula - traced) / traced), or "-"."""
    formula = formula_bytes(plan)
    traced = sum(plan.record.held[c].bytes for c in MODEL_STATE)
    if formula is None or not traced or plan.record.untraced:
        return "-"
    return f"{sum(formula.values()) / traced - 1:+.1%}"


@reading_no_run
def plans_table(plans, device_gib: float | None = None, unit: str | None = None) -> pd.DataFrame:
    """Several plans, a row each: per-rank model state, activations, peak (in `unit`: KiB, MiB or GiB; None
    picks the one the largest peak reads best in), collectives and FLOPs; `device_gib`: a column saying
    whether the peak fits a device of that size."""
    if unit is None:
        largest = max((p.record.peak_bytes for p in plans), default=0)
        unit = next((u for u in ("KiB", "MiB") if largest < 1024 * UNITS[u]), "GiB")
    if unit not in UNITS:
        raise ValueError(f"unit: must be one of {', '.join(UNITS)} (got {unit!r})")
    size = UNITS[unit]
    big_flops = max((p.record.flops for p in plans), default=0) >= 1e12
    rows = []
    for p in plans:
        rec, spec = p.record, p.spec
        row = {"ranks": spec.world_size, "strategy": _label(spec),
               **{f"{c} {unit}": round(rec.held[c].bytes / size, 2) for c in MODEL_STATE},
               f"ddp_buckets {unit}": round(rec.held["ddp_buckets"].bytes / size, 2),
               "ZeRO formula's gap": _gap(p),
               f"activations {unit}": round(rec.held["activations"].bytes / size, 2),
               f"peak {unit}": round(rec.peak_bytes / size, 2), "peak in": rec.peak_phase or "-",
               "collectives": ", ".join(f"{c.count} {c.op}" for c in rec.collectives) or "-",
               f"sent {unit}": round(sum(c.wire_bytes for c in rec.collectives) / size, 2),
               **({"TFLOP": round(rec.flops / 1e12, 1)} if big_flops else {"GFLOP": round(rec.flops / 1e9, 2)})}
        if device_gib is not None:
            row[f"fits {device_gib:g} GiB"] = "not traced" if rec.untraced else \
                ("yes" if rec.peak_bytes <= device_gib * GIB else "no")
        rows.append(row)
    return pd.DataFrame(rows)


@reading_no_run
def corrections(plans) -> list[str]:
    """A sentence for each place a torch tool disagreed with a direct count, and one for each untraced plan."""
    out = []
    for p in plans:
        where = f"{p.spec.strategy} at {p.spec.world_size} ranks"
        out += [f"{where}: {c.tool} counted {c.tool_bytes / GIB:.3g} GiB of {c.category.replace('_', ' ')}, "
                f"{c.kept_source} holds {c.kept_bytes / GIB:.3g} GiB; the plan keeps {c.kept_bytes / GIB:.3g} GiB"
                for c in p.record.corrections]
        if p.record.untraced:
            out.append(f"{where}: not traced ({p.record.untraced}); model state from the formula only")
    return out


@reading_no_run
def estimate_table(plans, cluster: str = "h100-ib") -> tuple[pd.DataFrame, tuple[str, ...]]:
    """Each plan's step time on a named cluster (`predict.plan.CLUSTERS`), an estimate: milliseconds at the
    fast and slow ends of the published figures; and the assumptions, which go beside it."""
    if cluster not in CLUSTERS:
        raise ValueError(f"cluster: must be one of {', '.join(CLUSTERS)} (got {cluster!r})")
    too_many = [p.spec.world_size for p in plans if p.spec.world_size > CLUSTERS[cluster].max_ranks]
    if too_many:
        raise ValueError(f"cluster: {cluster} has {CLUSTERS[cluster].max_ranks} devices; a plan asks for {too_many[0]}")
    rows, assumptions = [], {}
    for p in plans:
        spec = p.spec
        e = step_estimate(p.record.flops, p.record.collectives, p.record.buckets_bytes, spec.world_size,
                          spec.strategy, CLUSTERS[cluster], spec.dtype)
        rows.append({"ranks": spec.world_size, "strategy": _label(spec),
                     "TFLOP a rank": round(p.record.flops / 1e12, 1), "compute ms": f"{e.compute_s[0] * 1e3:.0f}-{e.compute_s[1] * 1e3:.0f}",
                     "communication ms": f"{e.comm_s[0] * 1e3:.0f}-{e.comm_s[1] * 1e3:.0f}",
                     "step ms (estimate)": f"{e.step_s[0] * 1e3:.0f}-{e.step_s[1] * 1e3:.0f}"})
        # every plan's lines but its own FLOP count (a column): the cluster, the link, each strategy's overlap
        for a in (e.assumptions[0], *e.assumptions[2:]):
            assumptions[a] = None
    c = CLUSTERS[cluster]
    peaks = ", ".join(peak_label(k, v) for k, v in c.peak_tflops.items() if k in {p.spec.dtype for p in plans})
    compute = (f"compute: each plan's TFLOP (FlopCounterMode, forward and backward) at {peaks} x model FLOPs "
               f"utilisation (MFU) {c.mfu[0]:.0%} (fast) / {c.mfu[1]:.0%} (slow), a share large BF16 runs reach")
    lines = list(assumptions)
    return pd.DataFrame(rows), (lines[0], compute, *lines[1:])


LEDGER = {"parameters": "forward", "gradients": "backward", "optimizer_state": "step", "ddp_buckets": "forward",
          "activations": "forward"}


def _measured(run) -> tuple[dict[str, int], int]:
    """Rank 0's ledger in the run's last step (the one after the step that created the optimizer state),
    category -> bytes, each read in its `LEDGER` phase; and that step's peak."""
    step = run.ranks[0].memory.steps[-1]
    return {c: step.phases[phase][c] for c, phase in LEDGER.items()}, step.peak


@reading(run="train")
def side_by_side(run, plan) -> pd.DataFrame:
    """A real run's rank 0 and its plan, category by category (bytes): the run's ledger in the step after
    the one that created the optimizer state, the plan's figure, their difference and the plan's source;
    then the step's peak."""
    ledger, peak = _measured(run)
    rows = []
    for c, real in ledger.items():
        planned = plan.record.held[c].bytes
        rows.append({"category": c, "real run, B": f"{real:,}", "plan, B": f"{planned:,}",
                     "plan / run": f"{planned / real:.4f}" if real else ("equal" if planned == real else "-"),
                     "plan's source": plan.record.held[c].source if real or planned else "-"})
    rows.append({"category": "peak", "real run, B": f"{peak:,}", "plan, B": f"{plan.record.peak_bytes:,}",
                 "plan / run": f"{plan.record.peak_bytes / peak:.4f}", "plan's source": plan.record.peak_source})
    return pd.DataFrame(rows).set_index("category")


@reading_no_run
def agreement_reading(pairs) -> str:
    """One sentence over (run, plan) pairs: which categories agree to the byte, and how far activations and
    the peak are."""
    measured = [(_measured(r), p) for r, p in pairs]
    exact = all(ledger[c] == p.record.held[c].bytes for (ledger, _), p in measured for c in MODEL_STATE + ("ddp_buckets",))
    gaps = {p.spec.strategy: (p.record.held["activations"].bytes / max(1, ledger["activations"]) - 1,
                              p.record.peak_bytes / peak - 1) for (ledger, peak), p in measured}
    said = "; ".join(f"{s}: activations {a:+.1%}, peak {k:+.1%}" for s, (a, k) in gaps.items())
    return (f"Model state and DDP's buckets: {'equal to the byte in every strategy' if exact else 'NOT all equal'}. "
            f"The plan against the run: {said}.")


@reading_no_run
def scale_reading(plans) -> str:
    """How rank 0's model state and activations move with the world size, per strategy, from smallest to
    largest world size."""
    out = []
    for strategy in dict.fromkeys(p.spec.strategy for p in plans):
        mine = sorted((p for p in plans if p.spec.strategy == strategy), key=lambda p: p.spec.world_size)
        lo, hi = mine[0], mine[-1]
        state = [sum(p.record.held[c].bytes for c in MODEL_STATE) for p in (lo, hi)]
        act = [p.record.held["activations"].bytes for p in (lo, hi)]
        ratio = state[0] / state[1]
        line = (f"{strategy} from {lo.spec.world_size} to {hi.spec.world_size} ranks: model state "
                + ("unchanged" if state[0] == state[1] else f"{ratio:.3g}x smaller")
                + ", activations " + ("unchanged" if act[0] == act[1] else f"{act[0] / act[1]:.3g}x smaller"))
        padded = hi.record.parameters_local * hi.spec.world_size
        if strategy == "fsdp2" and padded > hi.record.parameters_total:
            line += (f" (not {hi.spec.world_size // lo.spec.world_size}x: every tensor is padded to split evenly, "
                     f"so {hi.spec.world_size} shards hold {padded / hi.record.parameters_total:.2f}x the parameters)")
            ddp = next((p for p in plans if p.spec.strategy == "ddp" and p.spec.world_size == hi.spec.world_size), None)
            if ddp is not None and hi.record.peak_bytes > ddp.record.peak_bytes:
                sent = [sum(c.wire_bytes for c in p.record.collectives) for p in (hi, ddp)]
                line += (f"; there its peak ({hi.record.peak_bytes / 2**20:.2f} MiB) is above DDP's "
                         f"({ddp.record.peak_bytes / 2**20:.2f} MiB) and it sends {sent[0] / sent[1]:.0f}x DDP's bytes: "
                         f"every gathered layer and every reduce-scatter carries the padding")
        out.append(line)
    return "; ".join(out) + "."


@reading_no_run
def fit_reading(plans, device_gib: float) -> str:
    """Which plans fit a device of `device_gib`, and what the largest part of each peak is."""
    out = []
    for p in plans:
        if p.record.untraced:
            out.append(f"{_label(p.spec)} on {p.spec.world_size}: not traced, no peak")
            continue
        biggest = max(p.record.at_peak, key=p.record.at_peak.get)
        share = p.record.at_peak[biggest] / p.record.peak_bytes
        out.append(f"{_label(p.spec)} on {p.spec.world_size}: peak {p.record.peak_bytes / GIB:.0f} GiB, "
                   f"{'fits' if p.fits(device_gib) else 'does not fit'}; at the peak, {share:.0%} of it is "
                   f"{PLAIN.get(biggest, biggest)}")
    return "; ".join(out) + "."


@reading_no_run
def at_peak_table(plans) -> pd.DataFrame:
    """What is live at each plan's peak, by category (GiB), a column per plan."""
    cols = {f"{_label(p.spec)} on {p.spec.world_size}": {c: round(p.record.at_peak.get(c, 0) / GIB, 2) for c in CATEGORIES}
            | {"peak": round(p.record.peak_bytes / GIB, 2)} for p in plans}
    return pd.DataFrame(cols)
