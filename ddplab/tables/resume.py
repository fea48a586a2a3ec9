"""Tables of checkpoint and resume (notebook 08): a run's trajectory, where a resumed run departs from
the uninterrupted one and by how much, which examples of the interrupted epoch were seen once, twice
or never, and what each checkpoint cost. `verify_resume_identical` is the chapter's check: a right
resume is the uninterrupted run, bit for bit; `verify_resume_tracks` is the check for a resume on
another world size, which sums the same global batch in another order (float rounding, not bits).
torch loads only to read rank 0's saved parameters (`Run.tensors`).
"""

from __future__ import annotations

import pandas as pd

from .. import verify
from .reads import reading



@reading(run="resume")
def trajectory(run) -> pd.DataFrame:
    """Per optimizer step of `run` (a resume task): the sampler's epoch, the global batch's mean token
    loss (all ranks' tokens), its distinct examples, the tokens the augmentation replaced (all ranks)
    and rank 0's parameter checksum after the step (DDP keeps every replica bit-identical)."""
    rows = []
    for i, s in enumerate(run.ranks[0].steps):
        mine = [r.steps[i] for r in run.ranks]
        rows.append({"step": s.step, "epoch": s.epoch,
                     "loss": sum(m.loss_sum for m in mine) / sum(m.tokens for m in mine),
                     "examples": len({j for m in mine for j in m.sample_ids}),
                     "augmented": sum(m.augmented for m in mine), "param_checksum": s.param_checksum})
    return pd.DataFrame(rows).set_index("step")


def _global_batches(run) -> dict[int, set[int]]:
    return {s.step: {j for r in run.ranks for j in r.steps[i].sample_ids} for i, s in enumerate(run.ranks[0].steps)}


def _parameters(run) -> dict:
    """Rank 0's flat parameters after each step, by step number."""
    saved = run.tensors(0)
    return dict(zip(saved["steps"].tolist(), saved["params"]))


@reading(reference="resume", resumed="resume")
def departure(reference, resumed) -> pd.DataFrame:
    """Per step of `resumed`: whether it trains on the same global batch as `reference` in that step,
    whether its parameters are bit-identical (checksums), |loss difference| and the relative parameter
    distance ||p - p_ref|| / ||p_ref|| (rank 0's float64 copies). `attrs["first_departure"]`: the first
    step that is not bit-identical, or None."""
    ref, res = trajectory(reference), trajectory(resumed)
    missing = sorted(set(res.index) - set(ref.index))
    if missing:
        raise ValueError(f"{resumed.spec.name} trains step(s) {missing} that {reference.spec.name} never reached; "
                         f"compare it with an uninterrupted run of at least {max(res.index) + 1} steps")
    ref_params, res_params = _parameters(reference), _parameters(resumed)
    ref_batches, res_batches = _global_batches(reference), _global_batches(resumed)
    rows = []
    for step in res.index:
        p, q = res_params[step], ref_params[step]
        rows.append({"step": step, "epoch": int(res.at[step, "epoch"]), "reference_epoch": int(ref.at[step, "epoch"]),
                     "same_examples": res_batches[step] == ref_batches[step],
                     "identical": res.at[step, "param_checksum"] == ref.at[step, "param_checksum"],
                     "loss_diff": abs(float(res.at[step, "loss"]) - float(ref.at[step, "loss"])),
                     "param_distance": float((p - q).norm() / q.norm())})
    df = pd.DataFrame(rows).set_index("step")
    departed = df.index[~df["identical"]]
    df.attrs["first_departure"] = int(departed[0]) if len(departed) else None
    return df


@reading(saved="resume", resumed="resume", either=("resumed",))
def coverage_across_resume(saved, resumed) -> pd.DataFrame:
    """Per resumed run (one Run or a list): how many of the dataset's examples the interrupted epoch
    (the one `saved` stopped in) gave the optimizer never, once, twice or more often, counting the
    saving run's steps and the resume's steps labelled with that epoch; `epoch_finished`: the resume
    went on to a later epoch (if not, its "never" may only be still to come). An uninterrupted epoch
    over a data set that divides by the world size shows every example once."""
    epoch = saved.ranks[0].result.saved.epoch
    n = saved.spec.task.dataset_size
    before = [j for r in saved.ranks for s in r.steps if s.epoch == epoch for j in s.sample_ids]
    rows = []
    for run in resumed if isinstance(resumed, (list, tuple)) else [resumed]:
        seen = list(before)
        seen += [j for r in run.ranks for s in r.steps if s.epoch == epoch for j in s.sample_ids]
        counts = [seen.count(i) for i in range(n)]
        rows.append({"run": run.spec.name, "epoch": epoch, "never": counts.count(0), "once": counts.count(1),
                     "twice": counts.count(2), "more": sum(c > 2 for c in counts),
                     "epoch_finished": any(s.epoch > epoch for s in run.ranks[0].steps)})
    return pd.DataFrame(rows).set_index("run")


@reading(runs="resume")
def checkpoints(runs) -> pd.DataFrame:
    """Per run that saved or resumed: the checkpoint's step, epoch and sampler position, its DCP bytes
    (model and optimizer, every rank's files) and the slowest rank's dcp.save or dcp.load time."""
    rows = []
    for run in runs:
        for what in ("saved", "resumed"):
            infos = [getattr(r.result, what) for r in run.ranks]
            if infos[0] is None:
                continue
            c = infos[0]
            rows.append({"run": run.spec.name, "checkpoint": what, "step": c.step, "epoch": c.epoch,
                         "epoch_consumed": c.epoch_consumed, "saved_world_size": c.world_size,
                         "start_offset": run.ranks[0].result.start_offset if what == "resumed" else None,
                         "dcp_kib": c.dcp_bytes / 1024, "ms": max(i.ms for i in infos)})
    df = pd.DataFrame(rows).set_index("run")
    df["start_offset"] = df["start_offset"].astype("Int64")   # none for a saving run
    return df


@reading(reference="resume", resumed="resume")
def verify_resume_identical(reference, resumed) -> None:
    """Notebook 08's check: every step `resumed` trained has bit-identical parameters (checksums) to the
    same step of the uninterrupted `reference`. Raises `verify.CheckFailed` naming the first step that
    departs, with its loss difference and parameter distance (tests/tasks/test_resume.py)."""
    d = departure(reference, resumed)
    first, n, same = d.attrs["first_departure"], len(d), int(d["identical"].sum())
    seen = f"{same} of {n} steps bit-identical"
    if first is not None:
        seen += (f"; step {first} departs first (|loss difference| {d.at[first, 'loss_diff']:.3g}, relative "
                 f"parameter distance {d.at[first, 'param_distance']:.3g})")
    verify.that(f"{resumed.spec.name} continues {reference.spec.name} bit for bit from step {d.index[0]} "
                f"(parameter checksums)", first is None, seen=seen, expected=f"{n} of {n} steps bit-identical")


@reading(reference="resume", resumed="resume")
def verify_resume_tracks(reference, resumed, rel: float = 1e-4) -> None:
    """A resume on another world size with the same global batch: every step takes the same examples
    as `reference`, and the parameters stay within `rel` (relative distance): float rounding, since the
    ranks sum the gradient in another order. Raises `verify.CheckFailed` otherwise."""
    d = departure(reference, resumed)
    other = d.index[~d["same_examples"]].tolist()
    verify.that(f"{resumed.spec.name} trains on {reference.spec.name}'s global batch in each of its {len(d)} steps",
                not other, seen=f"other examples in step(s) {other}" if other else f"the same in all {len(d)}",
                expected=f"the same in all {len(d)}")
    verify.below(f"{resumed.spec.name} tracks {reference.spec.name}: relative parameter distance per step",
                 d["param_distance"], rel)


@reading(reference="resume", resumed="resume", saved="resume", either=("resumed",))
def resume_summary(reference, resumed: list, saved=None) -> pd.DataFrame:
    """One row per resumed run against `reference`: the first step that departs (None: bit-identical
    throughout), |loss difference| and relative parameter distance at the first resumed step and at
    the last, whether every step trained on the reference's global batch, and (given the saving run)
    how many examples of the interrupted epoch the optimizer saw twice or more, and never."""
    resumed = [resumed] if hasattr(resumed, "spec") else resumed   # one resumed run, or a list
    rows = []
    for run in resumed:
        d = departure(reference, run)
        first, last = d.index[0], d.index[-1]
        row = {"resume": run.spec.name, "first_departure": d.attrs["first_departure"],
               "loss_diff_first": d.at[first, "loss_diff"], "distance_first": d.at[first, "param_distance"],
               "distance_last": d.at[last, "param_distance"], "same_examples": bool(d["same_examples"].all())}
        if saved is not None:
            c = coverage_across_resume(saved, run).iloc[0]
            row.update(seen_twice_or_more=int(c["twice"] + c["more"]), never_seen=int(c["never"]),
                       epoch_finished=bool(c["epoch_finished"]))
        rows.append(row)
    return pd.DataFrame(rows).set_index("resume")
