"""Plans as tables: what one rank holds at a cluster's world size, each figure with its source, and the
ZeRO paper's formula beside it with its gap (what a formula misses). Used by notebook 12 and `ddplab plan`.
"""

from __future__ import annotations

import pandas as pd

from ..predict.plan import CLUSTERS, step_estimate
from ..predict.zero import zero_state_bytes
from ..record.plan import CATEGORIES
from .reads import reading_no_run

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
        row = {"category": c, "GiB": fig.bytes / GIB, "at the peak, GiB": rec.at_peak.get(c, 0) / GIB,
               "source": fig.source}
        if formula is not None and c in formula:
            row["formula, GiB"] = formula[c] / GIB
            row["formula's gap"] = f"{(formula[c] - fig.bytes) / fig.bytes:+.1%}" if fig.bytes else "-"
        rows.append(row)
    rows.append({"category": f"peak ({rec.peak_phase})", "GiB": rec.peak_bytes / GIB,
                 "at the peak, GiB": rec.peak_bytes / GIB, "source": rec.peak_source})
    return pd.DataFrame(rows).set_index("category")


@reading_no_run
def plans_table(plans, device_gib: float | None = None) -> pd.DataFrame:
    """Several plans, a row each: per-rank model state, activations, peak, collectives and FLOPs;
    `device_gib`: a column saying whether the peak fits a device of that size."""
    rows = []
    for p in plans:
        rec, spec = p.record, p.spec
        strategy = spec.strategy + ("" if spec.reshard_after_forward else " (keep gathered)") + \
            (" + checkpointing" if spec.checkpointing else "")
        row = {"ranks": spec.world_size, "strategy": strategy,
               **{f"{c} GiB": rec.held[c].bytes / GIB for c in MODEL_STATE},
               "activations GiB": rec.held["activations"].bytes / GIB, "peak GiB": rec.peak_bytes / GIB,
               "peak in": rec.peak_phase or "-",
               "collectives": ", ".join(f"{c.count} {c.op}" for c in rec.collectives) or "-",
               "sent GiB": sum(c.wire_bytes for c in rec.collectives) / GIB, "TFLOP": rec.flops / 1e12}
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
        out += [f"{where}: {c.why}; the plan keeps {c.kept_bytes / GIB:.3g} GiB from {c.kept_source}"
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
    rows, assumptions = [], ()
    for p in plans:
        spec = p.spec
        e = step_estimate(p.record.flops, p.record.collectives, p.record.buckets_bytes, spec.world_size,
                          spec.strategy, CLUSTERS[cluster])
        rows.append({"ranks": spec.world_size, "strategy": spec.strategy,
                     "compute ms": f"{e.compute_s[0] * 1e3:.0f}-{e.compute_s[1] * 1e3:.0f}",
                     "communication ms": f"{e.comm_s[0] * 1e3:.0f}-{e.comm_s[1] * 1e3:.0f}",
                     "step ms (estimate)": f"{e.step_s[0] * 1e3:.0f}-{e.step_s[1] * 1e3:.0f}"})
        assumptions = e.assumptions[:3] + tuple(a for a in e.assumptions[3:] if a not in assumptions)
    return pd.DataFrame(rows), assumptions
