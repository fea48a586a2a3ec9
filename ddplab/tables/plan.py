"""Plans as tables: what one rank holds at a cluster's world size, each figure with its source, and the
ZeRO paper's formula beside it with its gap (what a formula misses). Used by notebook 12 and `ddplab plan`.
"""

from __future__ import annotations

import pandas as pd

from ..predict.plan import CLUSTERS, step_estimate
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
        row = {"category": c, "GiB": fig.bytes / GIB, "at the peak, GiB": rec.at_peak.get(c, 0) / GIB,
               "source": fig.source}
        if formula is not None and c in formula:
            row["formula, GiB"] = formula[c] / GIB
            row["formula's gap"] = f"{(formula[c] - fig.bytes) / fig.bytes:+.1%}" if fig.bytes else "-"
        rows.append(row)
    rows.append({"category": f"peak ({rec.peak_phase})", "GiB": rec.peak_bytes / GIB,
                 "at the peak, GiB": rec.peak_bytes / GIB, "source": rec.peak_source})
    return pd.DataFrame(rows).set_index("category")


UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": GIB}
PLAIN = {"comm_buffers": "gathered layers and communication buffers", "ddp_buckets": "DDP's buckets",
         "optimizer_state": "optimizer state",
         "temporaries": "temporaries (tensors the step makes and frees: activation gradients, recomputed activations)"}


def _label(spec) -> str:
    """"fsdp2 (keep gathered) + checkpointing": the strategy and its options, as the tables name it."""
    return spec.strategy + ("" if spec.reshard_after_forward else " (keep gathered)") + \
        (" + checkpointing" if spec.checkpointing else "")


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
    rows, assumptions = [], {}
    for p in plans:
        spec = p.spec
        e = step_estimate(p.record.flops, p.record.collectives, p.record.buckets_bytes, spec.world_size,
                          spec.strategy, CLUSTERS[cluster])
        rows.append({"ranks": spec.world_size, "strategy": _label(spec),
                     "TFLOP a rank": round(p.record.flops / 1e12, 1), "compute ms": f"{e.compute_s[0] * 1e3:.0f}-{e.compute_s[1] * 1e3:.0f}",
                     "communication ms": f"{e.comm_s[0] * 1e3:.0f}-{e.comm_s[1] * 1e3:.0f}",
                     "step ms (estimate)": f"{e.step_s[0] * 1e3:.0f}-{e.step_s[1] * 1e3:.0f}"})
        # every plan's lines but its own FLOP count (a column): the cluster, the link, each strategy's overlap
        for a in (e.assumptions[0], *e.assumptions[2:]):
            assumptions[a] = None
    c = CLUSTERS[cluster]
    compute = (f"compute: each plan's TFLOP (FlopCounterMode, forward and backward) at {c.peak_tflops:g} TFLOPS x "
               f"MFU {c.mfu[0]:.0%} (fast) / {c.mfu[1]:.0%} (slow)")
    lines = list(assumptions)
    return pd.DataFrame(rows), (lines[0], compute, *lines[1:])


LEDGER = {"parameters": "forward", "gradients": "backward", "optimizer_state": "step", "ddp_buckets": "forward",
          "activations": "forward"}


@reading(run="train")
def side_by_side(run, plan) -> pd.DataFrame:
    """A real run's rank 0 and its plan, category by category (bytes): the run's ledger in the step after
    the one that created the optimizer state, the plan's figure, their difference and the plan's source;
    then the step's peak."""
    measured = run.ranks[0].memory.steps[-1]
    rows = []
    for c, phase in LEDGER.items():
        real, planned = measured.phases[phase][c], plan.record.held[c].bytes
        rows.append({"category": c, "real run, B": real, "plan, B": planned, "plan - run": f"{planned - real:+,}",
                     "plan's source": plan.record.held[c].source})
    rows.append({"category": "peak", "real run, B": measured.peak, "plan, B": plan.record.peak_bytes,
                 "plan - run": f"{(plan.record.peak_bytes - measured.peak) / measured.peak:+.1%}",
                 "plan's source": plan.record.peak_source})
    return pd.DataFrame(rows).set_index("category")


@reading_no_run
def agreement_reading(pairs) -> str:
    """One sentence over (run, plan) pairs: which categories agree to the byte, and how far activations and
    the peak are."""
    exact = all(side_by_side(r, p).loc[c, "real run, B"] == side_by_side(r, p).loc[c, "plan, B"]
                for r, p in pairs for c in MODEL_STATE + ("ddp_buckets",))
    gaps = {p.spec.strategy: (side_by_side(r, p).loc["activations", "plan, B"] / max(1, side_by_side(r, p).loc[
        "activations", "real run, B"]) - 1, p.record.peak_bytes / r.ranks[0].memory.steps[-1].peak - 1) for r, p in pairs}
    said = "; ".join(f"{s}: activations {a:+.0%}, peak {k:+.0%}" for s, (a, k) in gaps.items())
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
        out.append(line)
    return "; ".join(out) + "."


@reading_no_run
def fit_reading(plans, device_gib: float) -> str:
    """Which plans fit a device of `device_gib`, and what the largest part of each peak is."""
    out = []
    for p in plans:
        biggest = max(p.record.at_peak, key=p.record.at_peak.get)
        share = p.record.at_peak[biggest] / p.record.peak_bytes
        out.append(f"{_label(p.spec)} on {p.spec.world_size}: peak {p.record.peak_bytes / GIB:.0f} GiB, "
                   f"{'fits' if p.fits(device_gib) else 'does not fit'}; {share:.0%} of it {PLAIN.get(biggest, biggest)}")
    return "; ".join(out) + "."
