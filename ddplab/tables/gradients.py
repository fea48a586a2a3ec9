"""Local, reduced and reference gradients of a finished run, compared (the gradients probe's tensors,
`rank/probes/gradients.py`). `check` and `check_case` give the rows, `combine` what a synchronization
with other weights would have produced, `verify_global_batch_gradient` notebook 01's central check.
torch loads on use. Used by notebooks 01 and 06.
"""

from __future__ import annotations

import pandas as pd

from .. import verify
from ..tensors import flat_float64
from .reads import reading, reading_no_run



def _flat(d: dict, names: list[str]):
    return flat_float64(d[n] for n in names)


@reading(run="train")
def load(run) -> list[dict]:
    """Each rank's saved gradients: {"local": {...}, "reduced": {...}} (+ "reference" on rank 0)."""
    if "gradients" not in run.spec.probes:
        raise ValueError(f"run {run.spec.name!r} has no gradients: run it with probes=('gradients',)")
    return [run.tensors(r.rank) for r in run.ranks]


@reading(run="train")
def check(run) -> list[dict]:
    """One row per rank: relative error of its local and reduced gradient against the reference,
    the reduced gradient's largest absolute error, and whether every rank holds the same bits."""
    tensors = load(run)
    ref_d = tensors[0]["reference"]
    names = list(ref_d)
    ref = _flat(ref_d, names)
    reduced0 = _flat(tensors[0]["reduced"], names)
    identical = all(bool((_flat(t["reduced"], names) == reduced0).all()) for t in tensors)
    rows = []
    for r, t in zip(run.ranks, tensors):
        local, red = _flat(t["local"], names), _flat(t["reduced"], names)
        rows.append({"rank": r.rank, "local_rel_error": float((local - ref).norm() / ref.norm()),
                     "reduced_rel_error": float((red - ref).norm() / ref.norm()),
                     "reduced_max_abs_error": float((red - ref).abs().max()),
                     "reduced_identical_on_all_ranks": identical})
    return rows


@reading(run="train")
def check_case(run, names: list[str] | None = None, k: int = 3) -> list[dict]:
    """The first `k` elements of a few tensors: every rank's local value, their mean, the reduced
    value and the reference, side by side (default tensors: the first, a middle and the last)."""
    tensors = load(run)
    all_names = list(tensors[0]["reference"])
    names = names or [all_names[0], all_names[len(all_names) // 2], all_names[-1]]
    rows = []
    for name in names:
        locals_ = [t["local"][name].flatten()[:k].double() for t in tensors]
        mean = sum(locals_) / len(locals_)
        for i in range(min(k, locals_[0].numel())):
            row = {"tensor": name, "element": i}
            row.update({f"local r{r}": float(v[i]) for r, v in enumerate(locals_)})
            row.update({"mean of locals": float(mean[i]),
                        "reduced": float(tensors[0]["reduced"][name].flatten()[i]),
                        "reference": float(tensors[0]["reference"][name].flatten()[i])})
            rows.append(row)
    return rows


@reading(run="train")
def combine(run, weights: list[float]) -> dict:
    """sum_r weights[r] * (rank r's local gradient): what a synchronization with these weights yields."""
    tensors = load(run)
    return {n: sum(w * t["local"][n].double() for w, t in zip(weights, tensors)) for n in tensors[0]["local"]}


@reading(run="train")
def gradient_check(run) -> pd.DataFrame:
    """Per rank: local and reduced gradient against the single-process reference (gradients probe)."""
    return pd.DataFrame(check(run)).set_index("rank")


@reading_no_run
def verify_global_batch_gradient(check: pd.DataFrame, rel_error: float = 1e-5) -> None:
    """Notebook 01's central check, on a `gradient_check(run)` table: after the all-reduce every rank
    holds the global-batch gradient (relative error against the single-process reference below
    `rel_error`, float32 rounding) and the same bits on every rank. Raises `verify.CheckFailed`
    otherwise: for a rank-mean loss over unequal local batches, or ranks that never synchronize
    (tests/views/test_key_checks.py)."""
    verify.below("after the all-reduce every rank holds the global-batch gradient, up to float32 rounding",
                 check["reduced_rel_error"], rel_error)
    verify.that("the reduced gradient has the same bits on every rank", check["reduced_identical_on_all_ranks"])


@reading(run="train")
def gradient_values(run, names=None, k: int = 3) -> pd.DataFrame:
    """A few gradient elements: each rank's local value, their mean, the reduced value, the reference."""
    return pd.DataFrame(check_case(run, names, k)).set_index(["tensor", "element"])


@reading(runs="train")
def normalization(runs) -> pd.DataFrame:
    """One row per run (e.g. one per loss_norm): how far the reduced gradient is from the reference."""
    rows = []
    for run in runs:
        first = check(run)[0]
        rows.append({"run": run.spec.name, "loss_norm": run.spec.loss_norm, "dtype": run.spec.dtype,
                     "local_batch": list(run.spec.local_batches), "seq_len": list(run.spec.seq_lens),
                     "reduced_rel_error": first["reduced_rel_error"],
                     "identical_on_all_ranks": first["reduced_identical_on_all_ranks"]})
    return pd.DataFrame(rows).set_index("run")
