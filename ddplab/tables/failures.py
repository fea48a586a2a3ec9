"""Notebook 08's tables of failures: what the launcher said about each failure provoked on
purpose, how long it took, and what DDP's find_unused_parameters changes in a healthy run (its
buckets; the step times of the two separate runs are shown, not judged).

`failure_table(outcomes)` takes `launch.provoked.provoke` outcomes (`failures.Provoked`);
`verify_failures_diagnosed` raises `verify.CheckFailed` unless every one named exactly its faulty rank
(a crash or a death before any collective could time out), left no process behind, and was diagnosed as
the kind of failure it is, in the words `SIGNS` lists (tests/launch/test_provoked.py feeds it wrong outcomes; notebook 08 feeds it real ones).
"""

from __future__ import annotations

import statistics

import pandas as pd

from .. import verify
from ..failures import Provoked
from .stats import robust_spread
from .reads import reading, reading_no_run


DIAGNOSIS_GRACE_S = 15.0   # the launch's own start and stop, beyond the collective timeout
# what each provoked failure's diagnosis must be and say (torch 2.13's own words where DDP or gloo speaks);
# {timeout} is the run's timeout_s
SIGNS = {"skip-backward": ("hang", ["Rank 1 never arrived", "DDP gradient all-reduce",
                                    "the collective timed out after timeout_s={timeout} s"]),
         "extra-all-reduce": ("missing-result", ["killed by SIGABRT in 'extra-all-reduce' of step 1", "collective mismatch"]),
         "shape-mismatch": ("crash", ["'ddp-construct'", "appears not to match sizes"]),
         "unused-parameter": ("crash", ["'forward' of step 1", "Expected to have finished reduction",
                                        "Parameter indices which did not receive grad for rank 1"]),
         # (where its peers were is a race: the launcher may stop them before they write an error)
         "sigkill": ("missing-result", ["killed by SIGKILL in 'sigkill' of step 1"])}


@reading_no_run
def failure_table(outcomes: list[Provoked]) -> pd.DataFrame:
    """One row per provoked failure: the fault and its rank, the diagnosis' kind and the ranks it names,
    seconds from the launch to the error against timeout_s + 15 s, orphans, and the first sentence."""
    rows = []
    for o in outcomes:
        d = o.diagnosis
        rows.append({"fault": o.fault_kind, "faulty_rank": o.fault_rank, "diagnosis": d.kind if d else "no failure",
                     "named_ranks": d.ranks if d else [], "named_right": bool(d) and d.ranks == [o.fault_rank],
                     "seconds": round(o.seconds, 1), "startup_s": round(o.startup_s, 1),
                     "after_start_s": round(o.seconds - o.startup_s, 1), "bound_s": o.timeout_s + DIAGNOSIS_GRACE_S,
                     "orphans": len(o.orphans), "says": _first_sentence(d.summary) if d else ""})
    return pd.DataFrame(rows).set_index("fault")


def _first_sentence(text: str) -> str:
    head = text.split(". ", 1)[0]
    return head if head.endswith(".") else head + "."


@reading_no_run
def verify_failures_diagnosed(outcomes: list[Provoked]) -> None:
    """Every provoked failure failed the run, named exactly its faulty rank, with no process of the run
    left alive; a crash or a death was named before any collective could time out (the launcher stops
    the survivors at once, instead of letting them wait out timeout_s); for a hang, which is named only
    once its collective timed out, the seconds are printed beside the launcher's own bound, timeout_s + 15 s."""
    table = failure_table(outcomes)
    verify.equal("the ranks each failure's diagnosis names, by fault (exactly the faulty rank)",
                 {f: list(r) for f, r in table["named_ranks"].items()}, {f: [r] for f, r in table["faulty_rank"].items()})
    # from the moment every rank began its task: start-up (processes, imports, the process group) is
    # what a loaded machine stretches without bound, and no collective timeout covers it
    named = {o.name: o for o in outcomes if o.diagnosis is not None}
    after = {n: o.seconds - o.startup_s for n, o in named.items()}
    quick = {n: round(after[n] - o.timeout_s, 2) for n, o in named.items() if o.diagnosis.kind != "hang"}
    if quick:
        verify.below("crashes and deaths named before a collective could time out (seconds from the ranks' start, "
                     "minus timeout_s, by run)", list(quick.values()), 0.0)
    for n, o in named.items():
        if o.diagnosis.kind == "hang":
            bound = o.timeout_s + DIAGNOSIS_GRACE_S
            print(f"{n}: the hang was named {after[n]:.1f} s after its ranks started (its collective's timeout: "
                  f"{o.timeout_s:g} s; the launcher's bound, {bound:g} s, was not needed)" if after[n] < bound else
                  f"{n}: the hang was named {after[n]:.1f} s after its ranks started, past the launcher's bound "
                  f"({bound:g} s)")
    verify.equal("processes left behind by the failed runs", int(table["orphans"].sum()), 0)
    signs = [o for o in outcomes if o.fault_kind in SIGNS and o.diagnosis is not None]   # (no failure: failed above)
    verify.equal("each failure's kind of diagnosis (hang, crash, missing result), by run",
                 {o.name: o.diagnosis.kind for o in signs}, {o.name: SIGNS[o.fault_kind][0] for o in signs})
    missing = {o.name: [p for p in _phrases(o) if p not in o.diagnosis.summary] for o in signs}
    verify.equal("what each diagnosis must say, missing from it (by run)", {k: v for k, v in missing.items() if v}, {})


def _phrases(o: Provoked) -> list[str]:
    return [p.format(timeout=f"{o.timeout_s:g}") for p in SIGNS[o.fault_kind][1]]


@reading(runs="train")
def find_unused_cost(runs, warmup: int = 2) -> pd.DataFrame:
    """Per run: find_unused_parameters, the buckets DDP used in the first and in the last step (it
    rebuilds them in gradient-ready order after step 0 only without find_unused_parameters), and the
    step time after `warmup` steps (median, and the spread 1.4826 x MAD)."""
    rows = []
    for run in runs:
        steps = run.ranks[0].steps
        ms = run.step_ms(warmup)
        m = statistics.median(ms)
        rows.append({"run": run.spec.name, "find_unused_parameters": run.spec.find_unused_parameters,
                     "buckets_first_step": len(steps[0].buckets or []), "buckets_last_step": len(steps[-1].buckets or []),
                     "step_ms": m, "spread_ms": robust_spread(ms)})
    return pd.DataFrame(rows).set_index("run")


@reading_no_run
def find_unused_step_times(cost: pd.DataFrame) -> str:
    """One sentence on a `find_unused_cost` table: both runs' step time (median and spread) and their
    difference, as numbers only: the two are separate runs, not interleaved, so no verdict on the
    graph walk's cost (shown, not judged)."""
    off, on = cost[~cost["find_unused_parameters"]].iloc[0], cost[cost["find_unused_parameters"]].iloc[0]
    return (f"step time after warm-up, median (spread, 1.4826 x MAD): find_unused_parameters=False "
            f"{off['step_ms']:.2f} ms ({off['spread_ms']:.2f}), True {on['step_ms']:.2f} ms ({on['spread_ms']:.2f}), a difference of "
            f"{on['step_ms'] - off['step_ms']:+.2f} ms; two separate runs, not interleaved: shown, not judged")


@reading_no_run
def witness_table(outcomes: list[Provoked]) -> pd.DataFrame:
    """Per provoked failure, ddplab's diagnosis beside torch's own witness: the rank(s) ddplab names, the
    rank(s) torch's flight recorder analyzer names in the ranks' records (`witnesses`), the collective
    (its sequence number in its group) and how the ranks diverged there, whose records it had, and
    whether the two agree ("not compared" where torch's records name no rank, with its reason)."""
    rows = []
    for o in outcomes:
        d = o.diagnosis
        f = getattr(d, "flight", None)
        rows.append({"fault": o.fault_kind, "ddplab_names": d.ranks if d else [],
                     "torch_names": list(f.ranks) if f else [],
                     "collective": f"#{f.seq} {f.collective}" if f and f.ranks else "",
                     "how": {"missing": "never joined", "mismatch": "differs from the lowest rank"}.get(f.how, "") if f else "",
                     "records_of": list(f.dumps) if f else [],
                     "agree": ("yes" if sorted(d.ranks) == sorted(f.ranks) else "NO") if f and f.ranks and d else
                              "not compared",
                     "why_not": "" if f and f.ranks else (f.why_not if f else "no rank left a testimony")})
    return pd.DataFrame(rows).set_index("fault")
