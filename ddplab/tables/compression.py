"""Tables of DDP's communication hooks (notebook 10): bytes each rank wrote against the hook's payload
rule (`predict/compression.py`), what compression did to learning, and whether it paid, predicted and
measured.

Steps pair across hooks by (round, step in the round): every hook ran its step i of round r within one
pass over the arms, after an untimed barrier (`rank/tasks/compression.py`); a step is timed by its
slowest rank. Timing claims go through `claims` on those pairs."""

from __future__ import annotations

import statistics

import numpy as np
import pandas as pd

from .. import claims, verify
from ..signtest import median_interval
from ..predict import comm, compression
from ..units import rel_error
from .stats import slowest_rank
from .reads import reading, reading_no_run



ROUNDING = ("allreduce", "fp16", "bf16")   # hooks whose only error is rounding: worst_element bounds them


def _arms(run, group: str = "world", rank: int = 0) -> dict:
    return {a.hook: a for a in run.ranks[rank].result.arms if a.group == group}


def _link(run) -> str:
    """What the run's all-reduces travelled on, as its claims name it: "1GbE link" or "loopback"."""
    return f"{run.spec.link.name} link" if run.spec.link is not None else "loopback"


def _psgd(run) -> compression.PowerSGD:
    t = run.spec.task
    return compression.PowerSGD(t.matrix_approximation_rank, t.start_powerSGD_iter, t.min_compression_rate)


@reading(run="compression")
def framing(run) -> pd.DataFrame:
    """Per all-reduce size: the ring's share per rank, what each rank wrote (median over ranks and
    repeats) and the difference: gloo's framing, bytes a call writes beyond its payload."""
    w = run.world_size
    rows = []
    for per_rank in zip(*[r.result.framing for r in run.ranks]):
        n = per_rank[0].bytes
        written = [b for c in per_rank for b in c.write_bytes]
        ring = comm.ring_bytes_per_rank(n, w)
        rows.append({"bytes": n, "ring_share": ring, "written": statistics.median(written),
                     "framing_min": min(written) - ring, "framing_max": max(written) - ring,
                     "ms": statistics.median(m for c in per_rank for m in c.ms)})
    return pd.DataFrame(rows).set_index("bytes")


@reading(run="compression")
def framing_per_call(run) -> float:
    """gloo's framing bytes per all-reduce call: the median over every size, rank and repeat."""
    return float(statistics.median(framing(run)[["framing_min", "framing_max"]].to_numpy().ravel()))


@reading(run="compression")
def framing_at(run):
    """gloo's framing as a function of a call's bytes: the median measured at that size (the task
    measures every size its hooks send), linear between the measured sizes for any other."""
    table = framing(run)
    sizes, measured = list(table.index), list(table["written"] - table["ring_share"])
    return lambda n: float(np.interp(n, sizes, measured))   # the end sizes' framing beyond them


@reading(run="compression")
def bucket_shapes(run) -> list[list[int]]:
    """The shapes of the gradients in the hooks' one bucket: the parameters that require a gradient
    (DDP leaves frozen ones out of its buckets)."""
    result = run.ranks[0].result
    keep = result.requires_grad or [True] * len(result.parameter_shapes)
    return [s for s, k in zip(result.parameter_shapes, keep) if k]


def _step_indices(arm) -> list[tuple[str, int, int]]:
    """(phase, 0-based step index, bytes written) for every step of `arm` that wrote bytes."""
    out = [("learn", t, s.write_bytes) for t, s in enumerate(arm.learn)]
    return out + [("timed", arm.first_step + j, s.write_bytes) for j, s in enumerate(arm.steps)]


@reading(run="compression")
def bytes_table(run, rule=compression.written_bytes) -> pd.DataFrame:
    """Per hook and per kind of step (PowerSGD's plain steps apart from its compressed ones): the bytes
    the hook all-reduces (its payload rule, on the gradients that require grad: `bucket_shapes`), what
    `rule` predicts each rank writes (ring share + gloo's framing at each call's size, `framing_at`),
    what the ranks wrote (median, min, max over every rank and step) and the worst relative error.
    `rule(hook, shapes, world_size, framing, step, psgd)` is the prediction under test (`framing`: bytes
    as a function of a call's size)."""
    w, psgd, frame = run.world_size, _psgd(run), framing_at(run)
    shapes = bucket_shapes(run)
    rows = {}
    for r in run.ranks:
        for arm in (a for a in r.result.arms if a.group == "world"):
            for _, step, written in _step_indices(arm):
                plain = arm.hook == "powersgd" and step < psgd.start_iter
                key = (arm.hook, "plain (before start_powerSGD_iter)" if plain else "every step")
                predicted = rule(arm.hook, shapes, w, frame, step, psgd)
                row = rows.setdefault(key, {"payload_bytes": compression.payload_bytes(arm.hook, shapes, step, psgd),
                                            "calls": len(compression.hook_calls(arm.hook, shapes, step, psgd)),
                                            "predicted": predicted, "written": [], "errors": []})
                row["written"].append(written)
                row["errors"].append(abs(written - predicted) / predicted if predicted else float(written != 0))
    table = pd.DataFrame([{"hook": h, "steps": kind, "payload_bytes": v["payload_bytes"], "calls": v["calls"],
                           "predicted_written": v["predicted"], "written_median": statistics.median(v["written"]),
                           "written_min": min(v["written"]), "written_max": max(v["written"]),
                           "worst_rel_error": max(v["errors"]), "n": len(v["written"])}
                          for (h, kind), v in rows.items()])
    return table.set_index(["hook", "steps"])


@reading_no_run
def verify_bytes(table: pd.DataFrame, rel: float = 0.02) -> None:
    """Every rank's bytes in every step within `rel` of the prediction, for every hook (a hook predicted
    to write nothing must write nothing). Raises `verify.CheckFailed` otherwise."""
    verify.below("each rank writes, in every step, the hook's payload rule's bytes (ring share + gloo's framing "
                 "per call): the worst relative error per hook", table["worst_rel_error"], rel)


@reading(run="compression")
def learning(run) -> pd.DataFrame:
    """Per hook, over the learning steps (the same batches from the same start):
    - `final_loss`, `loss_gap` (its gap to the float32 all-reduce's at the end), `largest_gap` on the way;
    - `step_error`: the averaged gradient it delivered against the exact average of the same local
      gradients, |delivered - exact| / |exact|, median over the steps it compressed;
    - `summed_error`: the same for the sums over all the learning steps (what error feedback is meant to
      reduce);
    - `worst_element`: the largest error of any element in any step, over the mean of the ranks' |g| for
      that element (what a cast-and-sum's rounding is bounded by: `predict.compression.rounding_bound`);
      for the hooks that only round (`ROUNDING`), NaN for the others, whose error is no rounding;
    - `param_gap`: how far the parameters ended from the float32 run's, over how far that run moved."""
    arms = _arms(run)
    psgd, base = _psgd(run), arms["allreduce"]
    if not base.learn:
        raise ValueError("run: its learn_steps is 0; use recipes.hook_comparison(learn_steps=12)")
    rows = []
    for hook, a in arms.items():
        gaps = [s.loss - b.loss for s, b in zip(a.learn, base.learn)]
        compressed = [s for t, s in enumerate(a.learn) if hook != "powersgd" or t >= psgd.start_iter]
        rows.append({"hook": hook, "final_loss": a.learn[-1].loss, "loss_gap": gaps[-1],
                     "largest_gap": max(gaps, key=abs),
                     "step_error": statistics.median(s.grad_error for s in compressed),
                     "summed_error": a.learn[-1].cumulative_error,
                     "worst_element": max(s.worst_element for s in compressed) if hook in ROUNDING else float("nan"),
                     "param_gap": a.param_gap})
    return pd.DataFrame(rows).set_index("hook")


@reading(run="compression")
def loss_gaps(run) -> dict[str, list[float]]:
    """Per hook, its global loss minus the float32 all-reduce's, step by step (the learning steps)."""
    arms = _arms(run)
    return {h: [s.loss - b.loss for s, b in zip(a.learn, arms["allreduce"].learn)] for h, a in arms.items()}


@reading(run="compression")
def summed_errors(run) -> dict[str, list[float]]:
    """Per hook, `learning`'s summed error after each learning step (the sums over the steps so far)."""
    return {h: [s.cumulative_error for s in a.learn] for h, a in _arms(run).items()}


@reading(run="compression")
def powersgd_reading(run) -> str:
    """What this run's learning steps say about PowerSGD, in sentences computed from them: its loss gap
    against noop's (no averaging at all), its error in the median step and summed, and whether the summed
    error grew or fell over the steps it compressed (with error feedback, growing means what it dropped
    piles up faster than it is sent). Ends with what holds on every run: torch's default start, read from
    the running torch."""
    import inspect

    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState

    table, start = learning(run), _psgd(run).start_iter
    p, noop = table.loc["powersgd"], table.loc["noop"]
    every = summed_errors(run)["powersgd"]
    summed, n = every[start:], len(every)
    ratio = abs(p["loss_gap"] / noop["loss_gap"]) if noop["loss_gap"] else 0.0
    gap = (f"within noop's {noop['loss_gap']:+.2g}" if abs(p["loss_gap"]) <= abs(noop["loss_gap"]) else
           f"{ratio:.{0 if ratio >= 10 else 1}f}x noop's {noop['loss_gap']:+.2g}" if noop["loss_gap"] else
           "where noop's is 0")
    feedback = run.spec.task.use_error_feedback
    trend = ("one compressed step: no trend yet" if len(summed) < 2 else
             "and growing" + (": what it dropped piled up faster than error feedback sent it" if feedback else
                              " (no error feedback: what it drops is lost)") if summed[-1] > summed[0] else
             "and falling as the steps add up")
    default = inspect.signature(PowerSGDState).parameters["start_powerSGD_iter"].default
    over = (" (farther than sending zeros would be" + (": it adds last step's leftovers)" if feedback else ")")
            if p["step_error"] > 1 else "")
    return (f"After {n} steps, compressing from step {start + 1}, PowerSGD's loss is {p['loss_gap']:+.3g} from "
            f"float32's, {gap} (no averaging at all).\n"
            f"In the median step it delivered a gradient {p['step_error']:.0%} off the true average{over}.\n"
            f"Summed over the steps, {p['summed_error']:.0%} off (noop's: {noop['summed_error']:.0%}), {trend}.\n"
            f"torch runs the plain all-reduce for the first start_powerSGD_iter steps ({default} by default):\n"
            f"early steps are the most sensitive to a wrong gradient.")


@reading(run="compression")
def paired_ms(run, hook: str, group: str = "world", field: str = "step_ms") -> list[float]:
    """The hook's timed steps in (round, step) order, each timed by its slowest rank."""
    return slowest_rank([[getattr(s, field) for s in _arms(run, group, r.rank)[hook].steps] for r in run.ranks])


@reading(run="compression")
def model_fit(run) -> comm.AlphaBeta:
    """The alpha-beta line of this launch's own all-reduces (`framing`), fitted by `predict.comm.fit`."""
    table = framing(run)
    return comm.fit(list(table.index), [ms / 1e3 for ms in table["ms"]])


@reading(run="compression")
def timing(run) -> pd.DataFrame:
    """Per hook: its cost on a one-rank group (communication free), the extra over the float32 hook's
    there (compressing and decompressing), the step the model predicts (`predict.compression.step_ms`:
    that local step + each call on this launch's alpha-beta line + the emulated link), the step measured
    (medians over the paired steps) and the model's error. `of_it_in_backward_ms`: how much of the
    compression cost lands inside backward (DDP calls the hook there; with one bucket, after the last
    gradient, so nothing of backward's own compute runs beside it)."""
    if not run.spec.task.local:
        raise ValueError("task.local: the step model needs each hook on a one-rank group; run with local=True")
    psgd, shapes, w, fit = _psgd(run), bucket_shapes(run), run.world_size, model_fit(run)
    link = run.spec.link
    link_s = (lambda c: link.wire_s(c, w)) if link is not None else None
    local_base = paired_ms(run, "allreduce", "local")
    backward_base = paired_ms(run, "allreduce", "local", "backward_ms")
    rows = []
    for hook, arm in _arms(run).items():
        local = paired_ms(run, hook, "local")
        backward = paired_ms(run, hook, "local", "backward_ms")
        calls = compression.hook_calls(hook, shapes, arm.first_step, psgd)
        predicted = compression.step_ms(statistics.median(local), calls, fit.predict, link_s)
        measured = statistics.median(paired_ms(run, hook))
        rows.append({"hook": hook, "local_ms": statistics.median(local),
                     "compress_ms": statistics.median(a - b for a, b in zip(local, local_base)),
                     "of_it_in_backward_ms": statistics.median(a - b for a, b in zip(backward, backward_base)),
                     "predicted_ms": predicted, "measured_ms": measured, "error": rel_error(predicted, measured)})
    return pd.DataFrame(rows).set_index("hook")


@reading(run="compression")
def cost_reading(run, table: pd.DataFrame) -> str:
    """One line per hook whose `compress_ms` (its one-rank step minus float32's there) is not above 0, and
    for noop (which does nothing): noise (the paired one-rank steps' interval holds 0), a real saving, or,
    for noop, a real cost (which can only be the machine drifting)."""
    lines, base = [], paired_ms(run, "allreduce", "local")
    for hook in [h for h in table.index if h != "allreduce" and (h == "noop" or table.loc[h, "compress_ms"] <= 0)]:
        diffs = [a - b for a, b in zip(paired_ms(run, hook, "local"), base)]
        center, low, high = median_interval(diffs)
        said = ("noise: the interval holds 0" if low <= 0 <= high else
                "real: it skips what even a one-rank all-reduce does (a call, a copy, a future)" if high < 0 and
                hook == "noop" else "real: on one rank it ran faster than float32's hook" if high < 0 else
                "the machine drifting between the arms, since noop does nothing")
        lines.append(f"{hook}'s compress_ms of {center:+.2f} ms is {said} ([{low:+.2f}, {high:+.2f}] ms over "
                     f"{len(diffs)} paired one-rank steps)")
    return "\n".join(lines)


@reading_no_run
def predictor_error(table: pd.DataFrame) -> float:
    """The step model's median absolute relative error over the hooks of a `timing` table."""
    return float(table["error"].abs().median())


@reading(run="compression")
def verdicts(run, table: pd.DataFrame) -> pd.DataFrame:
    """Per compressing hook, the model's call (faster or slower than the float32 all-reduce, by its
    predicted steps) judged on the paired measured steps: this run agrees, says the opposite, or cannot
    resolve it. A family: each claim at `claims.family(k)`. A finding of this run, never a failing check;
    where it cannot resolve, a quiet reference run's answer beside it (`claims.noted`; the column only if any)."""
    hooks = [h for h in table.index if h not in ("allreduce", "noop")]
    alpha, base = claims.family(len(hooks)), paired_ms(run, "allreduce")
    where = _link(run)   # one claim per link
    rows = []
    for hook in hooks:
        delta = table.loc[hook, "predicted_ms"] - table.loc["allreduce", "predicted_ms"]
        faster = delta < 0
        v = claims.paired(f"the model's call: {hook} makes the step {'shorter' if faster else 'longer'} than the "
                          f"float32 all-reduce ({where})", paired_ms(run, hook), base, alpha=alpha,
                          **({"below": 0.0} if faster else {"above": 0.0}))
        rows.append({"hook": hook, "predicted_delta_ms": delta, "measured_delta_ms": v.center,
                     "interval_ms": f"[{v.low:+.2f}, {v.high:+.2f}]", "model's call": "shorter" if faster else "longer",
                     "this run": {claims.HOLDS: "agrees", claims.CONTRADICTED: "the opposite"}.get(v.outcome, "not resolved"),
                     "reference run": claims.noted(v)})
    table = pd.DataFrame(rows).set_index("hook")
    return table if table["reference run"].any() else table.drop(columns="reference run")


@reading(run="compression")
def judge_pays(run, hooks=("fp16", "powersgd")) -> claims.Verdict:
    """"Every one of `hooks` shortens the step against the float32 all-reduce", on the paired steps: the
    weakest of the family (each at `claims.family(k)`, so its interval is wider than one claim's), reported
    under the family's claim with the weakest member named."""
    import dataclasses

    alpha, base = claims.family(len(hooks)), paired_ms(run, "allreduce")
    where = f"on the {run.spec.link.name} link" if run.spec.link is not None else "on loopback"
    members = [claims.paired(f"{h} shortens the step against the float32 all-reduce {where}", paired_ms(run, h), base,
                             below=0.0, alpha=alpha) for h in hooks]
    weakest = claims.weakest(members, then=lambda v: -v.high)   # the weakest "below 0": the highest upper end
    link = _link(run)
    return dataclasses.replace(weakest, claim=family_claim(hooks, link, hooks[members.index(weakest)]))


@reading_no_run
def family_claim(hooks, link: str, weakest: str) -> str:
    """`judge_pays`'s claim: every hook named in the headline, the weakest in a trailing bracket, which the
    claim's key leaves out (`references.claim_key`), so one claim keeps one key whichever hook is weakest."""
    return f"{', '.join(hooks)} each shorten the step against float32 ({link}) (per step) [the weakest of {len(hooks)}: {weakest}]"


@reading_no_run
def cluster(shapes, world_size: int, busbw_gb_s: float, latency_us: float, compute_ms: float, memory_gb_s: float,
            psgd=compression.PowerSGD(), hooks=("allreduce", "fp16", "powersgd")) -> pd.DataFrame:
    """A prediction, not a measurement: the step model (`predict.compression.cluster_step_ms`) per hook for a
    bucket holding `shapes`, on a link of `busbw_gb_s` bus bandwidth (nccl-tests' figure) and `latency_us`
    a call, with `compute_ms` of forward and backward and compression bounded by `memory_gb_s`; every
    input is an assumption the caller states. `saves_at_most_ms`: the step's gain over the float32 all-reduce
    with the whole all-reduce exposed (one bucket, nothing overlapped): an upper bound, since every
    millisecond that overlaps backward (chapter 05) is one that compressing cannot save."""
    rows = [{"hook": h, "payload_mb": compression.payload_bytes(h, shapes, 10 ** 9, psgd) / 1e6,
             **compression.cluster_step_ms(h, shapes, world_size, busbw_gb_s * 1e9, latency_us * 1e-6, compute_ms,
                                           memory_gb_s * 1e9, psgd)} for h in hooks]
    table = pd.DataFrame(rows).set_index("hook")
    table["saves_at_most_ms"] = table.loc["allreduce", "step_ms"] - table["step_ms"]
    return table
