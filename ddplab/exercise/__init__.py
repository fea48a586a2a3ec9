"""The practice exercise's checker: `check(evidence)` re-runs the network a learner declared and checks
every piece of evidence they wrote down (exercises/data_parallel_exercise.ipynb).

    from ddplab import exercise
    evidence = exercise.template(exp)     # the pieces to fill in, each None until you do
    evidence["batch"] = {"local_batch": [8, 8, 8, 8], "accum_steps": 2, "global_batch": ...}   # ... is todo
    ...
    report = exercise.check(evidence)     # one row per check, with feedback you can act on
    report.assert_passed("batch")         # EvidenceFailed listing what failed (nbgrader's tests)

The evidence is plain data the learner writes (numbers, lists, dicts, one function), never one of our
objects passed through, so filling it in means reading the right number off a run. The notebook gives
each piece as a template whose values are `...`; a piece with a `...` left is "todo", not checked:

    "experiment"  the declared `Experiment` (network, ranks, batches); steps >= 2
    "batch"       {"local_batch": [b_0, ...], "accum_steps": k, "global_batch": G}            batch.py
    "memory"      {rank: {"parameters", "gradients", "optimizer_state", "activations"}}: bytes    memory.py
    "gradients"   a check case's local, reduced and global-batch values, and the convention   gradients.py
    "readiness"   {"ready_order": parameter names in the order their gradients became ready}  readiness.py
    "buckets"     {"count", "trace": [{"bytes", "launch_ms", "done_ms"}], "last_ready_ms",
                   "summed_ms", "exposed_ms"}                                                  buckets.py
    "comm"        {"payload_bytes", "bytes_per_rank": {D: bytes}}                              comm.py

The checker's own runs are hidden from the learner: the main run and a second check case use another
seed (the case also other batches), so what the seed cannot change (bytes, orders, counts) must match
exactly, what it changes (gradient values) is checked on a re-run of the learner's own check case, and
the learner's convention on the hidden case. Every classic mistake has its own message (`MISTAKES`,
tests/exercise/test_exercise.py). A failing check says what is wrong and where to read it, never the value it
expected, so feedback cannot be copied into a pass. Bad evidence structure is a finding (one that lists
every key the piece needs), not an exception; a missing or unsupported "experiment", or an unknown
piece, is a ValueError naming the field, before anything runs.
"""

from __future__ import annotations

import time

from ..spec import Experiment
from . import batch, buckets, comm, gradients, memory, readiness
from .report import PIECES, EvidenceFailed, Finding, Report
from .shape import Malformed, leaves, placeholders

__all__ = ["EvidenceFailed", "Finding", "MISTAKES", "PIECES", "Report", "evidence_run", "check", "check_case",
           "hidden_runs", "judge", "template"]

HIDDEN_SEED_OFFSET = 7919     # the checker's runs: the learner's seed plus this (or `seed=`)
MODEL_STATE = memory.MODEL_STATE
JUDGES = {"batch": batch, "memory": memory, "gradients": gradients, "readiness": readiness, "buckets": buckets,
          "comm": comm}
MISTAKES = {   # the classic wrong evidence each piece catches with its own message (tests/exercise/test_exercise.py)
    "memory divided by the world size": "memory",
    "unweighted mean of rank means with unequal batches": "gradients",
    "source order reported as ready order": "readiness",
    "summed bucket durations reported as exposed time": "buckets",
    "a payload that scales with the local batch": "comm",
    "global batch without the accumulation factor": "batch",
    "bytes per rank without the ring factor 2(D-1)/D": "comm",
}


def template(exp: Experiment) -> dict:
    """The evidence to fill in: the declared experiment, and every piece None until you fill it."""
    _declared(exp)
    return {"experiment": exp, **{p: None for p in PIECES}}


def evidence_run(exp: Experiment, seed: int | None = None) -> Experiment:
    """The run the evidence reads (memory, readiness, buckets, communication): `exp` with the probes
    those pieces need, at `seed` (default: its own)."""
    return exp.replace(name=f"{exp.name}-evidence", seed=exp.seed if seed is None else seed,
                       probes=("memory", "readiness", "buckets", "bytes"))


def check_case(exp: Experiment, local_batch) -> Experiment:
    """The small gradient check case: `exp`'s network and ranks, these (unequal) local batches, one
    step, no accumulation, the gradients probe (each rank's local gradient, DDP's, and the reference)."""
    return exp.replace(name=f"{exp.name}-check-case", local_batch=tuple(local_batch), accum_steps=1, steps=1,
                       probes=("gradients",))


def _declared(exp) -> Experiment:
    if not isinstance(exp, Experiment):
        raise ValueError(f"experiment: give the ddplab.Experiment you ran, got {type(exp).__name__}")
    if exp.task.kind != "train":
        raise ValueError(f"experiment: the exercise checks a training step, not a {exp.task.kind!r} task")
    if exp.steps < memory.STEP + 1:
        raise ValueError(f"experiment.steps={exp.steps}: the memory table is read after step {memory.STEP}, "
                         f"so run at least {memory.STEP + 1} steps")
    if exp.sync != "ddp" or exp.sharding != "none":
        raise ValueError("experiment.sync/sharding: the exercise checks classic DDP (sync='ddp', sharding='none')")
    if exp.loss_norm != "rank-mean":
        raise ValueError(f"experiment.loss_norm={exp.loss_norm!r}: the exercise checks DDP's plain convention, each "
                         f"rank's loss a mean over its own examples ('rank-mean')")
    if len(set(exp.seq_lens)) > 1:
        raise ValueError("experiment.seq_len: one sequence length for every rank (with different ones the "
                         "examples of a rank do not weigh the same)")
    return exp


def _validated(evidence) -> Experiment:
    if not isinstance(evidence, dict):
        raise ValueError(f"evidence: give a dict (exercise.template(exp)), got {type(evidence).__name__}")
    unknown = sorted(set(evidence) - {"experiment", *PIECES})
    if unknown:
        raise ValueError(f"evidence: unknown piece(s) {unknown}; the pieces are {', '.join(PIECES)}")
    return _declared(evidence.get("experiment"))


def check(evidence: dict, seed: int | None = None, progress=True) -> Report:
    """Re-run the declared network (hidden: `seed`, default the learner's plus HIDDEN_SEED_OFFSET)
    and check every piece of `evidence` that is filled in; a piece left None is a "todo" finding."""
    t0 = time.monotonic()
    report = judge(evidence, hidden_runs(evidence, seed, progress))
    report.seconds = time.monotonic() - t0
    return report


def hidden_runs(evidence: dict, seed: int | None = None, progress=True) -> dict:
    """The checker's own runs for the pieces filled in, in one launch: name -> Run ({} if none)."""
    from .. import run_many

    exp = _validated(evidence)
    hidden = exp.seed + HIDDEN_SEED_OFFSET if seed is None else seed
    filled = {p for p in PIECES if _todo(p, evidence.get(p)) is None}
    exps = []
    if {"memory", "readiness", "buckets", "comm"} & filled:
        exps.append(evidence_run(exp, hidden).replace(name="exercise-hidden"))
    case = gradients.case_batches(evidence["gradients"], exp.world_size) if "gradients" in filled else None
    if isinstance(case, list):
        exps.append(check_case(exp, case).replace(name="exercise-your-case"))
        exps.append(check_case(exp, gradients.hidden_batches(case)).replace(name="exercise-hidden-case", seed=hidden))
    if not exps:
        return {}
    return dict(zip([e.name for e in exps], run_many(exps, name="exercise", progress=progress)))


def _todo(piece: str, ev) -> Finding | None:
    """The "todo" finding of a piece not filled in yet (None, or a template with `...` left), else None."""
    if ev is None:
        return Finding(piece, "filled in", None, f"not filled in yet: {JUDGES[piece].HINT}")
    every = placeholders(ev, piece)
    if every and len(every) == leaves(ev):
        return Finding(piece, "filled in", None, f"not filled in yet (replace each ... of the template): "
                       f"{JUDGES[piece].HINT}")
    left = [p for p in every if p != "gradients['convention']"]   # the values are checked before it
    if not left:
        return None
    more = f" and {len(left) - 4} more" if len(left) > 4 else ""
    return Finding(piece, "filled in", None, f"not filled in yet: {', '.join(left[:4])}{more} still ...; "
                   f"fill in every value of the piece, then check again")


def judge(evidence: dict, runs: dict) -> Report:
    """Check every filled-in piece of `evidence` against the checker's runs (`hidden_runs`)."""
    exp = _validated(evidence)
    findings = []
    for piece in PIECES:
        ev = evidence.get(piece)
        todo = _todo(piece, ev)
        if todo is not None:
            findings.append(todo)
            continue
        if piece == "gradients":
            case = gradients.case_batches(ev, exp.world_size)
            if isinstance(case, Finding):
                findings.append(case)
                continue
        try:
            findings.extend(JUDGES[piece].judge(ev, exp, runs))
        except Malformed as e:
            findings.append(Finding(piece, "shape", False, str(e)))
    return Report(findings)
