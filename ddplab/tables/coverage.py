"""Tables of data coverage (notebook 08): per epoch, which examples the ranks' DistributedSamplers
covered exactly once, dropped or duplicated, how many batches each rank ran, and whether each rank's
order changed from the last epoch; the example x epoch grid of who saw what; and the chapter's
checks, `verify_each_example_once` and `verify_order_changes`. Counted from the ids the ranks
recorded (`spec/coverage.py`), never from what the spec asked for."""

from __future__ import annotations

from collections import Counter

import pandas as pd

from .. import verify
from .reads import reading



def _listed(items: list, most: int = 10) -> str:
    """'[3, 7]', or '[0, 1, ... (30 in all)]' for a long list (a check's one line stays one line)."""
    shown = ", ".join(map(str, items[:most]))
    return f"[{shown}]" if len(items) <= most else f"[{shown}, ... ({len(items)} in all)]"


def _ids(run, epoch: int) -> list[list[int]]:
    """Per rank, the ids it took in `epoch`, in order."""
    return [r.result.epochs[epoch].ids for r in run.ranks]


def _epochs(run) -> int:
    counts = {len(r.result.epochs) for r in run.ranks}
    if len(counts) != 1:
        raise ValueError(f"run {run.spec.name!r}: the ranks recorded different numbers of epochs "
                         f"({', '.join(str(len(r.result.epochs)) for r in run.ranks)})")
    return counts.pop()


@reading(run="data-coverage")
def tally(run, epoch: int) -> dict:
    """One epoch's coverage: the ids `seen_once`, `dropped` (seen by no rank) and `duplicated` (seen
    more than once), each sorted, and how often each id was seen (`counts`)."""
    counts = Counter(i for ids in _ids(run, epoch) for i in ids)
    n = run.spec.task.dataset_size
    return {"counts": counts,
            "seen_once": [i for i in range(n) if counts[i] == 1],
            "dropped": [i for i in range(n) if counts[i] == 0],
            "duplicated": sorted(i for i, c in counts.items() if c > 1)}


@reading(run="data-coverage")
def coverage_table(run) -> pd.DataFrame:
    """Per epoch: of the `dataset_size` examples, how many were seen exactly once, which were dropped
    and which duplicated (DistributedSampler's padding), the ids consumed over all ranks, the examples
    and batches per rank (unequal batch counts would hang DDP: one rank waits in an all-reduce the
    others never start), whether each rank's order differs from the previous epoch's (None in
    epoch 0), and whether every rank's all_gathered copy matches what each rank recorded."""
    rows = []
    for e in range(_epochs(run)):
        t, ids = tally(run, e), _ids(run, e)
        batches = [r.result.epochs[e].num_batches for r in run.ranks]
        rows.append({"epoch": e, "dataset_size": run.spec.task.dataset_size, "seen_once": len(t["seen_once"]),
                     "dropped": t["dropped"], "duplicated": t["duplicated"], "consumed": sum(map(len, ids)),
                     "examples_per_rank": [len(x) for x in ids], "batches_per_rank": batches,
                     "equal_batches": len(set(batches)) == 1,
                     "order_changed": None if e == 0 else [a != b for a, b in zip(ids, _ids(run, e - 1))],
                     "all_gather_agrees": all(r.result.gathered[o.rank][e] == o.result.epochs[e]
                                              for r in run.ranks for o in run.ranks)})
    return pd.DataFrame(rows).set_index("epoch")


@reading(run="data-coverage")
def sample_grid(run, value: str = "ranks") -> pd.DataFrame:
    """Example id x epoch: `value="ranks"` gives the ranks that saw the example (a tuple, sorted; empty
    where it was dropped, two entries where it was duplicated), `value="count"` how often it was seen."""
    if value not in ("ranks", "count"):
        raise ValueError(f"value must be 'ranks' or 'count' (got {value!r})")
    columns = {}
    for e in range(_epochs(run)):
        seen = {i: [] for i in range(run.spec.task.dataset_size)}
        for r in run.ranks:
            for i in r.result.epochs[e].ids:
                seen[i].append(r.rank)
        columns[e] = {i: tuple(sorted(rs)) if value == "ranks" else len(rs) for i, rs in seen.items()}
    df = pd.DataFrame(columns)
    df.index.name, df.columns.name = "example", "epoch"
    return df


@reading(run="data-coverage")
def verify_each_example_once(run, epoch: int | None = None) -> None:
    """Notebook 08's check: in `epoch` (default: every epoch) the ranks together took every one of the
    `dataset_size` examples exactly once. Raises `verify.CheckFailed` naming the dropped and the
    duplicated ids of the first epoch where they were not."""
    n_epochs = _epochs(run)
    if epoch is not None and epoch not in range(n_epochs):
        raise ValueError(f"epoch must be in 0..{n_epochs - 1} (got {epoch!r})")
    epochs = range(n_epochs) if epoch is None else [epoch]
    n, w = run.spec.task.dataset_size, run.spec.world_size
    where = f"epoch {epoch}" if epoch is not None else f"each of its {n_epochs} epoch(s)"
    claim = f"{run.spec.name}: every one of the {n} examples seen exactly once by the {w} ranks in {where}"
    expected = f"all {n} once, none dropped or duplicated"
    for e in epochs:
        t = tally(run, e)
        if t["dropped"] or t["duplicated"]:
            dropped = f"dropped {_listed(t['dropped'])}" if t["dropped"] else "none dropped"
            duplicated = f"duplicated {_listed(t['duplicated'])}" if t["duplicated"] else "none duplicated"
            verify.that(claim, False, seen=f"in epoch {e}: {len(t['seen_once'])} once, {dropped}, {duplicated}",
                        expected=expected)
    verify.that(claim, True, seen=expected, expected=expected)


@reading(run="data-coverage")
def verify_order_changes(run) -> None:
    """Notebook 08's check: from one epoch to the next, every rank's order of examples changed (what
    `sampler.set_epoch(epoch)` is for). Raises `verify.CheckFailed` naming the ranks and epochs that
    repeated the previous epoch's order (a forgotten set_epoch, or shuffle=False)."""
    n_epochs = _epochs(run)
    if n_epochs < 2:
        raise ValueError(f"run {run.spec.name!r} has {n_epochs} epoch; comparing orders needs at least 2")
    repeats = [f"rank {r} in epoch {e}" for e in range(1, n_epochs)
               for r, (a, b) in enumerate(zip(_ids(run, e), _ids(run, e - 1))) if a == b]
    pairs = (n_epochs - 1) * run.spec.world_size
    verify.that(f"{run.spec.name}: every rank's order of examples changes from epoch to epoch", not repeats,
                seen=f"{pairs - len(repeats)} of {pairs} epoch-to-epoch orders changed"
                     + (f"; the previous epoch's order again on {_listed(repeats)}" if repeats else ""),
                expected=f"all {pairs} changed")
