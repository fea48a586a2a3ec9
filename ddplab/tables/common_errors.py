"""The four common errors of data parallelism (notebook 08, seed claim C18) together: the runs that show
them (`recipes.common_error_runs`, one launch) sorted by error (`error_runs`), each error's misclaim
(`MISCLAIMS`), and one row per error (`error_table`) with what the runs say (numbers from them) and a
verdict computed from the runs (what their specs set and what they recorded), never from timing.

Each error is a claim about a concept, so its table, its check and its row live with that concept:

- strong scaling claimed after growing the global batch: `global_batch.weak_as_strong`,
  `global_batch.fixed_global_batch_setup` (prints the setup), row `global_batch.scaling_error`;
- model-state memory divided by the data-parallel degree: `memory.divided_state`,
  `memory.verify_replicated_state` (beside the replicated model of `predict/memory.py`), row `memory.state_error`;
- the summed bucket all-reduce durations read as exposed overhead: `readiness.summed_as_exposed`,
  `readiness.overlap_sentence` (the sum beside `record.exposed_tail_ms`, as arithmetic), row
  `readiness.overlap_error`;
- parameter source order taken for gradient-ready order: `readiness.source_as_ready_order`,
  `readiness.verify_ready_not_source_order`, row `readiness.order_error`.

The step times of separate runs are shown, not judged, and the summed durations against the tail are
arithmetic. Numbers in, DataFrames out (no processes).
"""

from __future__ import annotations

import pandas as pd

from ..recipes.common_errors import PREFIX
from .global_batch import scaling_error
from .memory import state_error
from .readiness import order_error, overlap_error
from .reads import reading


GROUPS = ("weak", "strong", "memory", "overlap", "ready")


@reading(runs=None, mapping=("runs",))   # the chapter's dict of every run: it picks the train runs by name
def error_runs(runs) -> dict[str, list]:
    """The runs of a `recipes.common_error_runs()` launch (a list, or a dict by name), by group: "weak",
    "strong", "memory", "overlap" ([DDP, compute-only]) and "ready", in launch order. Runs of other
    recipes launched beside them (names without the "errors-" prefix) are left out."""
    runs = list(runs.values()) if isinstance(runs, dict) else list(runs)
    groups: dict[str, list] = {g: [] for g in GROUPS}
    for run in runs:
        name = run.spec.name
        if not name.startswith(PREFIX):
            continue
        group = name[len(PREFIX):].split("-")[0]
        if group not in groups:
            raise ValueError(f"run {name!r} is not one of recipes.common_error_runs(): its names start with "
                             f"{PREFIX!r} and a group ({', '.join(GROUPS)})")
        groups[group].append(run)
    missing = [g for g, rs in groups.items() if not rs]
    if missing:
        raise ValueError(f"no runs of group(s) {', '.join(missing)}: pass every run of recipes.common_error_runs()")
    groups["overlap"].sort(key=lambda r: r.spec.sync != "ddp")   # DDP first, then compute-only
    return groups


MISCLAIMS = {
    "global batch": "weak-scaling runs (global batch grows with the ranks) show a strong-scaling speed-up",
    "replicated memory": "model-state memory per rank is the one-process state divided by the world size",
    "summed all-reduce": "the bucket all-reduce durations, summed, are the communication overhead of a step",
    "ready order": "gradients become ready in parameter source order (or its reverse)",
}


@reading(runs=None, mapping=("runs",))   # the chapter's dict of every run: it picks the train runs by name
def error_table(runs) -> pd.DataFrame:
    """One row per error of a `recipes.common_error_runs()` launch (the list `run_many` returned, or a dict
    by name): the misclaim, what these runs say (numbers from them), and a verdict computed from the runs
    ("wrong: ..." or "not shown: ...")."""
    g = error_runs(runs)
    rows = {"global batch": scaling_error(g["weak"], g["strong"]), "replicated memory": state_error(g["memory"]),
            "summed all-reduce": overlap_error(*g["overlap"]), "ready order": order_error(g["ready"][0])}
    return pd.DataFrame([{"error": e, "misclaim": MISCLAIMS[e], **row} for e, row in rows.items()]).set_index("error")
