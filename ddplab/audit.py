"""The practice audit's checker: `check(evidence)` re-runs the network a learner declared and checks
every piece of evidence they wrote down (exercises/audit_data_parallel.ipynb).

    from ddplab import audit
    evidence = audit.template(exp)        # the pieces to fill in, each None until you do
    evidence["batch"] = {"local_batch": [8, 8, 8, 8], "accum_steps": 2, "global_batch": 64}
    ...
    report = audit.check(evidence)        # one row per check, with feedback you can act on
    report.assert_passed("batch")         # an AssertionError listing what failed (nbgrader's tests)

The evidence is plain data the learner writes (numbers, lists, dicts), never one of our objects
passed through, so filling it in means reading the right number off a run:

    "experiment"  the declared `Experiment` (network, ranks, batches); steps >= 2
    "batch"       {"local_batch": [b_0, ...], "accum_steps": k, "global_batch": G}
    "memory"      {rank: {"parameters", "gradients", "optimizer_state": bytes after step 1's optimizer
                   step, "activations": bytes held after step 1's forward}}, every rank
    "gradients"   a check case (`check_case(exp, local_batch)`, unequal local batches): {"local_batch",
                   "parameter", "element", "local": [every rank's local gradient], "reduced": DDP's,
                   "global_batch_gradient": the one-process gradient of the whole batch,
                   "convention": f(local values, local batches) -> the global-batch gradient}
    "readiness"   {"ready_order": parameter names in the order their gradients became ready}
    "buckets"     {"count", "trace": [{"launch_ms", "done_ms"}, ...] (rank 0, last step, ms after its
                   backward began), "backward_end_ms", "summed_ms", "exposed_ms"}
    "comm"        {"payload_bytes": bytes one step all-reduces, "bytes_per_rank": {D: bytes each rank
                   sends in a ring all-reduce of it, for D = the declared world size and one D > 2}}

The checker's own run is hidden from the learner: the main run and a second check case use another
seed (and the case other batches), so a number copied from somewhere else does not pass; what the
seed cannot change (bytes, orders, counts) must match exactly, and what it changes (gradient values)
is checked on the learner's own check case re-run, to float32 rounding, and the learner's convention
on the hidden case. Every classic mistake has its own message (`MISTAKES`). Bad evidence structure
is a finding, not an exception; only a missing or wrong "experiment" raises a ValueError, before
anything runs.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass

from .spec import Experiment

PIECES = ("batch", "memory", "gradients", "readiness", "buckets", "comm")
MODEL_STATE = ("parameters", "gradients", "optimizer_state")
MEMORY_STEP = 1
HIDDEN_SEED_OFFSET = 7919     # the checker's runs: the learner's seed plus this (or `seed=`)
FLOAT32_EPS = 2.0 ** -23
MS_ROUNDING = 0.005           # a time written to two decimals of a millisecond


@dataclass
class Finding:
    """One check: `ok` True (held), False (failed) or None (the piece is not filled in yet)."""

    piece: str
    check: str
    ok: bool | None
    message: str


class Report:
    """Every finding of one `check`; shows as a table in a notebook."""

    def __init__(self, findings: list[Finding], seconds: float = 0.0):
        self.findings, self.seconds = findings, seconds

    def of(self, *pieces: str) -> list[Finding]:
        return [f for f in self.findings if not pieces or f.piece in pieces]

    def passed(self, *pieces: str) -> bool:
        found = self.of(*pieces)
        return bool(found) and all(f.ok for f in found)

    def failures(self, *pieces: str) -> list[Finding]:
        return [f for f in self.of(*pieces) if not f.ok]

    def assert_passed(self, *pieces: str) -> None:
        """Raise an AssertionError naming every check of `pieces` (default: all) that did not hold."""
        unknown = [p for p in pieces if p not in PIECES]
        if unknown:
            raise ValueError(f"pieces: {unknown} are not pieces of the evidence ({', '.join(PIECES)})")
        bad = self.failures(*pieces)
        if bad:
            raise AuditFailed("; ".join(f"{f.piece}: {f.message}" for f in bad))

    def _repr_html_(self) -> str:
        mark = {True: "&#9989;", False: "&#10060;", None: "&#9998;"}
        rows = "".join(f"<tr><td>{mark[f.ok]}</td><td>{f.piece}</td><td style='text-align:left'>{html.escape(f.check)}</td>"
                       f"<td style='text-align:left'>{html.escape(f.message)}</td></tr>" for f in self.findings)
        held = sum(1 for f in self.findings if f.ok)
        return (f"<table class='ddplab-audit'><tr><th></th><th>piece</th><th>check</th><th>feedback</th></tr>{rows}</table>"
                f"<small>{held} of {len(self.findings)} checks hold ({self.seconds:.1f} s)</small>")

    def __repr__(self) -> str:
        mark = {True: "ok  ", False: "FAIL", None: "todo"}
        return "\n".join(f"{mark[f.ok]} {f.piece}: {f.check}: {f.message}" for f in self.findings)


class AuditFailed(AssertionError):
    """Some evidence did not pass: one line a learner can act on, not a traceback into ddplab."""

    def _render_traceback_(self) -> list[str]:
        return [f"AuditFailed: {self}"]


# -- what the learner starts from, and the runs they (and the checker) make ----------------------------

def template(exp: Experiment) -> dict:
    """The evidence to fill in: the declared experiment, and every piece None until you fill it."""
    _declared(exp)
    return {"experiment": exp, **{p: None for p in PIECES}}


def audit_run(exp: Experiment, seed: int | None = None) -> Experiment:
    """The run the evidence reads (memory, readiness, buckets, communication): `exp` with the probes
    those pieces need, at `seed` (default: its own)."""
    return exp.replace(name=f"{exp.name}-audit", seed=exp.seed if seed is None else seed,
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
        raise ValueError(f"experiment: the audit is of a training step, not a {exp.task.kind!r} task")
    if exp.steps < MEMORY_STEP + 1:
        raise ValueError(f"experiment: steps={exp.steps}: the memory table is read after step {MEMORY_STEP}, "
                         f"so run at least {MEMORY_STEP + 1} steps")
    if exp.sync != "ddp" or exp.sharding != "none":
        raise ValueError("experiment: the audit is of classic DDP (sync='ddp', sharding='none')")
    return exp


# -- the checker ---------------------------------------------------------------------------------------

def check(evidence: dict, seed: int | None = None, progress=True) -> Report:
    """Re-run the declared network (hidden: `seed`, default the learner's plus HIDDEN_SEED_OFFSET)
    and check every piece of `evidence` that is filled in; a piece left None is a "todo" finding."""
    import time

    t0 = time.monotonic()
    runs = hidden_runs(evidence, seed, progress)
    report = judge(evidence, runs)
    report.seconds = time.monotonic() - t0
    return report


def _validated(evidence) -> Experiment:
    if not isinstance(evidence, dict):
        raise ValueError(f"evidence: give a dict (audit.template(exp)), got {type(evidence).__name__}")
    unknown = sorted(set(evidence) - {"experiment", *PIECES})
    if unknown:
        raise ValueError(f"evidence: unknown piece(s) {unknown}; the pieces are {', '.join(PIECES)}")
    return _declared(evidence.get("experiment"))


def hidden_runs(evidence: dict, seed: int | None = None, progress=True) -> dict:
    """The checker's own runs for the pieces filled in, in one launch: name -> Run."""
    from . import run_many

    exp = _validated(evidence)
    hidden = exp.seed + HIDDEN_SEED_OFFSET if seed is None else seed
    filled = {p for p in PIECES if evidence.get(p) is not None}
    exps = []
    if {"memory", "readiness", "buckets", "comm"} & filled:
        exps.append(audit_run(exp, hidden).replace(name="audit-hidden"))
    case = _case_batches(evidence["gradients"], exp.world_size) if "gradients" in filled else None
    if isinstance(case, list):
        exps.append(check_case(exp, case).replace(name="audit-your-case"))
        exps.append(check_case(exp, _hidden_batches(case)).replace(name="audit-hidden-case", seed=hidden))
    if not exps:
        return {}
    return dict(zip([e.name for e in exps], run_many(exps, name="audit", progress=progress)))


def judge(evidence: dict, runs: dict) -> Report:
    """Check every filled-in piece of `evidence` against the checker's runs (`hidden_runs`)."""
    exp = _validated(evidence)
    findings = [Finding(p, "filled in", None, f"not filled in yet: {HINTS[p]}") for p in PIECES
                if evidence.get(p) is None]
    for piece in PIECES:
        ev = evidence.get(piece)
        if ev is None:
            continue
        if piece == "gradients":
            case = _case_batches(ev, exp.world_size)
            if isinstance(case, Finding):
                findings.append(case)
                continue
        try:
            findings.extend(JUDGES[piece](ev, exp, runs))
        except _Malformed as e:
            findings.append(Finding(piece, "shape", False, str(e)))
    order = {p: i for i, p in enumerate(PIECES)}
    findings.sort(key=lambda f: order[f.piece])
    return Report(findings)


class _Malformed(Exception):
    """A piece whose structure is not the documented one: its message names the field."""


def _get(ev, key: str, piece: str):
    if not isinstance(ev, dict) or key not in ev or ev[key] is None:
        raise _Malformed(f"{piece}[{key!r}] is missing (see the description of this piece)")
    return ev[key]


def _number(v, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise _Malformed(f"{where}: expected a number, got {v!r}")
    return float(v)


def _close(a: float, b: float, tol: float) -> bool:
    return abs(a - b) <= tol


# -- batch ---------------------------------------------------------------------------------------------

def _judge_batch(ev, exp: Experiment, runs) -> list[Finding]:
    local = list(_get(ev, "local_batch", "batch"))
    accum = _get(ev, "accum_steps", "batch")
    g = _get(ev, "global_batch", "batch")
    out = []
    truth = exp.local_batches
    out.append(Finding("batch", "local batch of every rank", local == truth,
                       "matches the declared run" if local == truth else
                       f"the declared run gives ranks 0..{exp.world_size - 1} {truth} examples per micro-step; "
                       f"you wrote {local}"))
    out.append(Finding("batch", "accumulation steps", accum == exp.accum_steps,
                       "matches the declared run" if accum == exp.accum_steps else
                       f"the declared run accumulates {exp.accum_steps} micro-steps per optimizer step; you wrote {accum}"))
    right = sum(truth) * exp.accum_steps
    if g == right:
        msg = f"{g} = ({' + '.join(map(str, truth))}) x {exp.accum_steps}: every example of every micro-step on every rank"
    elif g == sum(truth) and exp.accum_steps > 1:
        msg = (f"{g} is one micro-step's examples: the global batch counts every micro-step an optimizer step "
               f"accumulates, sum of local batches x accum_steps = {sum(truth)} x {exp.accum_steps} = {right}")
    elif len(set(truth)) > 1 and g == truth[0] * exp.world_size * exp.accum_steps:
        msg = (f"{g} assumes every rank has rank 0's batch of {truth[0]}; the local batches differ, so add them: "
               f"{right}")
    else:
        msg = f"the global batch is sum of local batches x accum_steps = {right}; you wrote {g}"
    out.append(Finding("batch", "global batch = sum of local batches x accumulation steps", g == right, msg))
    return out


# -- memory --------------------------------------------------------------------------------------------

def _truth_memory(run) -> dict[int, dict[str, int]]:
    out = {}
    for r in run.ranks:
        st = r.memory.steps[MEMORY_STEP]
        out[r.rank] = {**{c: st.phases["step"][c] for c in MODEL_STATE}, "activations": st.phases["forward"]["activations"]}
    return out


def _judge_memory(ev, exp: Experiment, runs) -> list[Finding]:
    if not isinstance(ev, dict):
        raise _Malformed("memory: expected {rank: {category: bytes}}")
    truth = _truth_memory(runs["audit-hidden"])
    mine = {int(k): v for k, v in ev.items()}
    missing = [r for r in truth if r not in mine]
    if missing:
        return [Finding("memory", "every rank", False, f"rank(s) {missing} missing: the table needs a row for every "
                        f"one of the {exp.world_size} ranks, since every rank holds its own copy")]
    d = exp.world_size
    out = []
    for cat in (*MODEL_STATE, "activations"):
        wrong = []
        for r, row in truth.items():
            v = _number(_get(mine[r], cat, f"memory[{r}]"), f"memory[{r}][{cat!r}]")
            if v != row[cat]:
                wrong.append((r, v, row[cat]))
        if not wrong:
            out.append(Finding("memory", cat, True, f"every rank: {truth[0][cat]:,} bytes, exactly as the ledger counts"))
            continue
        r, v, t = wrong[0]
        if cat in MODEL_STATE and t and abs(v * d - t) <= d:
            msg = (f"{cat} on rank {r} is 1/{d} of what a rank holds ({v:,.0f} against {t:,}): classic DDP "
                   f"replicates parameters, gradients and optimizer state on every rank; it divides none of them "
                   f"by the world size (that is what ZeRO and FSDP change)")
        elif cat == "optimizer_state" and v == 0 and t:
            msg = (f"rank {r} holds {t:,} bytes of optimizer state after step {MEMORY_STEP}'s optimizer step "
                   f"(the optimizer creates it lazily, at its first step); you wrote 0")
        else:
            msg = (f"{cat} on rank {r}: the ledger counts {t:,} bytes (after step {MEMORY_STEP}'s "
                   f"{'forward' if cat == 'activations' else 'optimizer step'}); you wrote {v:,.0f} "
                   f"({(v - t) / t:+.1%})" if t else f"{cat} on rank {r}: the ledger counts 0 bytes; you wrote {v:,.0f}")
        out.append(Finding("memory", cat, False, msg))
    return out


# -- gradients -----------------------------------------------------------------------------------------

def _case_batches(ev, world_size: int):
    if not isinstance(ev, dict) or ev.get("local_batch") is None:
        return Finding("gradients", "shape", False, "gradients['local_batch'] is missing: the check case's local batches")
    b = list(ev["local_batch"])
    if len(b) != world_size or not all(isinstance(x, int) and x > 0 for x in b):
        return Finding("gradients", "shape", False, f"gradients['local_batch']: one positive integer per rank "
                       f"({world_size} of them), got {b}")
    if len(set(b)) == 1:
        return Finding("gradients", "unequal local batches", False,
                       f"the check case's local batches are all {b[0]}: with equal batches the weighted and the "
                       f"unweighted mean coincide, so the case cannot tell the conventions apart; give the ranks "
                       f"different batches, e.g. {[1 + 2 * r for r in range(world_size)]}")
    return b


def _hidden_batches(b: list[int]) -> list[int]:
    """Other unequal batches for the hidden case: the learner's, rotated, one example more on rank 0."""
    out = b[1:] + b[:1]
    out[0] += 1
    return out


def _element(tensors: dict, kind: str, name: str, i: int) -> float:
    return float(tensors[kind][name].flatten()[i])


def _judge_gradients(ev, exp: Experiment, runs) -> list[Finding]:
    run = runs["audit-your-case"]
    b = list(ev["local_batch"])
    name = _get(ev, "parameter", "gradients")
    i = int(_number(_get(ev, "element", "gradients"), "gradients['element']"))
    ts = [run.tensors(r.rank) for r in run.ranks]
    if name not in ts[0]["reference"]:
        raise _Malformed(f"gradients['parameter']: {name!r} is not a trainable parameter of the declared network "
                         f"(they are {', '.join(list(ts[0]['reference'])[:6])}, ...)")
    if not 0 <= i < ts[0]["reference"][name].numel():
        raise _Malformed(f"gradients['element']: {name} has {ts[0]['reference'][name].numel()} elements; got {i}")
    local_true = [_element(t, "local", name, i) for t in ts]
    reduced_true = _element(ts[0], "reduced", name, i)
    ref_true = _element(ts[0], "reference", name, i)
    scale = max(abs(v) for v in local_true + [ref_true]) or 1.0
    tol = 16 * FLOAT32_EPS * scale * exp.world_size   # between sums of D float32 terms done in other orders

    def same(mine: float, truth: float) -> bool:
        """A value the re-run reproduces bit for bit: only its float32 rounding may differ."""
        return abs(mine - truth) <= 8 * FLOAT32_EPS * max(abs(truth), 1e-3 * scale)

    local = [_number(v, f"gradients['local'][{r}]") for r, v in enumerate(_get(ev, "local", "gradients"))]
    reduced = _number(_get(ev, "reduced", "gradients"), "gradients['reduced']")
    glob = _number(_get(ev, "global_batch_gradient", "gradients"), "gradients['global_batch_gradient']")
    out = []
    if len(local) != exp.world_size:
        raise _Malformed(f"gradients['local']: one value per rank ({exp.world_size}), got {len(local)}")
    bad = [r for r in range(exp.world_size) if not same(local[r], local_true[r])]
    out.append(Finding("gradients", "every rank's local gradient", not bad,
                       f"{name}[{i}] on each rank matches a re-run of your check case" if not bad else
                       f"rank {bad[0]}'s local gradient of {name}[{i}] is {local_true[bad[0]]:.9g} in a re-run of your "
                       f"check case (seed {exp.seed}, local batches {b}); you wrote {local[bad[0]]:.9g}"))
    mean = sum(local_true) / len(local_true)
    if same(reduced, reduced_true):
        msg = (f"{reduced_true:.9g}: the mean of the {exp.world_size} local gradients (DDP sums them and divides by "
               f"the world size, folding 1/{exp.world_size} into the copy into the bucket)")
    elif _close(reduced, sum(local_true), tol * exp.world_size):
        msg = (f"{reduced:.9g} is the sum of the local gradients: DDP divides by the world size, so every rank "
               f"holds their mean, {reduced_true:.9g}")
    else:
        msg = f"DDP's reduced {name}[{i}] is {reduced_true:.9g} on every rank (the mean of the local ones); you wrote {reduced:.9g}"
    out.append(Finding("gradients", "DDP's reduced gradient", same(reduced, reduced_true), msg))
    weighted = sum(bi * g for bi, g in zip(b, local_true)) / sum(b)
    if same(glob, ref_true):
        msg = (f"{ref_true:.9g}: the one-process gradient of all {sum(b)} examples, the local gradients weighted by "
               f"b_r / B; DDP's reduced value ({reduced_true:.9g}) differs from it because the batches are unequal")
    elif _close(glob, mean, tol):
        msg = (f"{glob:.9g} is the unweighted mean of the ranks' mean gradients (DDP's reduced value): with unequal "
               f"local batches a rank with more examples must count more; the global-batch gradient is "
               f"sum_r (b_r / B) g_r = {weighted:.9g}, which is what one process computes on all {sum(b)} examples")
    else:
        msg = (f"one process computing the gradient of all {sum(b)} examples gets {ref_true:.9g}; you wrote {glob:.9g}")
    out.append(Finding("gradients", "the global-batch gradient", same(glob, ref_true), msg))
    conv = ev.get("convention")
    if conv is None:
        out.append(Finding("gradients", "your convention, on a hidden case", None,
                           "not filled in yet: gradients['convention'] = a function of (local values, local batches) "
                           "that returns the global-batch gradient"))
    else:
        out.append(_judge_convention(conv, runs["audit-hidden-case"], name))
    return out


def _judge_convention(conv, run, name: str) -> Finding:
    ts = [run.tensors(r.rank) for r in run.ranks]
    b = run.spec.local_batches
    locals_ = [t["local"][name].flatten().tolist() for t in ts]
    ref = ts[0]["reference"][name].flatten().tolist()
    scale = max(max(abs(v) for v in ref), max(abs(v) for col in locals_ for v in col)) or 1.0
    tol = 16 * FLOAT32_EPS * scale * len(b)
    worst, where = 0.0, 0
    try:
        for i in range(min(len(ref), 64)):
            got = float(conv([col[i] for col in locals_], list(b)))
            if not abs(got - ref[i]) <= worst:
                worst, where = abs(got - ref[i]), i
    except Exception as e:  # noqa: BLE001 - the learner's function: its error is feedback
        return Finding("gradients", "your convention, on a hidden case", False,
                       f"calling it on local values and batches {list(b)} raised {type(e).__name__}: {e}")
    ok = worst <= tol
    if ok:
        msg = f"on a case you did not see (local batches {list(b)}, another seed) it gives the one-process gradient"
    else:
        col = [c[where] for c in locals_]
        unweighted = sum(col) / len(col)
        got = float(conv(col, list(b)))
        hint = (" (that is the unweighted mean: weigh each rank's value by b_r / B)" if abs(got - unweighted) <= tol
                else "")
        msg = (f"on a hidden case (local batches {list(b)}) element {where} should be {ref[where]:.9g}; your "
               f"function gives {got:.9g}{hint}")
    return Finding("gradients", "your convention, on a hidden case", ok, msg)


# -- readiness -----------------------------------------------------------------------------------------

def _truth_ready(run) -> tuple[list[str], list[str]]:
    r0 = run.ranks[0]
    return [e.param for e in r0.steps[-1].backward.ready], list(r0.parameter_names)


def _judge_readiness(ev, exp: Experiment, runs) -> list[Finding]:
    order = list(_get(ev, "ready_order", "readiness"))
    truth, source = _truth_ready(runs["audit-hidden"])
    trainable = [p for p in source if p in set(truth)]
    if order == truth:
        msg = f"all {len(truth)} gradients, in the order backward produced them (first: {truth[0]}, last: {truth[-1]})"
    elif sorted(order) != sorted(truth):
        extra, lost = sorted(set(order) - set(truth)), sorted(set(truth) - set(order))
        msg = (f"the names are not this network's trainable parameters: {len(truth)} expected"
               + (f"; not parameters here: {extra[:3]}" if extra else "") + (f"; missing: {lost[:3]}" if lost else ""))
    elif order == trainable:
        msg = ("that is the order the parameters are declared in (model.parameters()), not the order their "
               "gradients became ready: backward starts from the loss, so the output layer's gradients come first; "
               "read the readiness probe's events")
    elif order == trainable[::-1]:
        k = next(j for j, (a, t) in enumerate(zip(order, truth)) if a != t)
        msg = (f"that is the reverse of the declaration order, the textbook assumption; the measured order differs "
               f"from position {k} on ({truth[k]} became ready there, not {order[k]}): read the readiness probe")
    else:
        k = next(j for j, (a, t) in enumerate(zip(order, truth)) if a != t)
        msg = f"position {k}: {truth[k]} became ready there, you wrote {order[k]}"
    return [Finding("readiness", "the order gradients became ready", order == truth, msg)]


# -- buckets -------------------------------------------------------------------------------------------

def _judge_buckets(ev, exp: Experiment, runs) -> list[Finding]:
    count = _get(ev, "count", "buckets")
    trace = _get(ev, "trace", "buckets")
    if not isinstance(trace, list) or not trace:
        raise _Malformed("buckets['trace']: a list of {'launch_ms', 'done_ms'}, one per bucket")
    spans = []
    for k, b in enumerate(trace):
        spans.append((_number(_get(b, "launch_ms", f"buckets['trace'][{k}]"), f"buckets['trace'][{k}]['launch_ms']"),
                      _number(_get(b, "done_ms", f"buckets['trace'][{k}]"), f"buckets['trace'][{k}]['done_ms']")))
    end = _number(_get(ev, "backward_end_ms", "buckets"), "buckets['backward_end_ms']")
    summed = _number(_get(ev, "summed_ms", "buckets"), "buckets['summed_ms']")
    exposed = _number(_get(ev, "exposed_ms", "buckets"), "buckets['exposed_ms']")
    truth = len(runs["audit-hidden"].ranks[0].steps[-1].buckets)
    out = [Finding("buckets", "how many buckets DDP built", count == truth == len(trace),
                   f"{truth} buckets in every step after the first (DDP rebuilds them from the ready order)"
                   if count == truth == len(trace) else
                   f"DDP built {truth} buckets for this network and bucket_bucket_cap; you wrote {count} and traced {len(trace)}"
                   .replace("bucket_bucket_cap", f"bucket_cap_mb={exp.bucket_cap_mb}"))]
    backwards = [k for k, (a, d) in enumerate(spans) if d < a]
    out.append(Finding("buckets", "every bucket finishes after it starts", not backwards,
                       "launch <= done for every bucket" if not backwards else
                       f"bucket {backwards[0]} is done at {spans[backwards[0]][1]} ms before its launch at "
                       f"{spans[backwards[0]][0]} ms: the trace's columns are swapped or from different clocks"))
    tol = MS_ROUNDING * (len(spans) + 1)
    summed_true = sum(d - a for a, d in spans)
    out.append(Finding("buckets", "summed bucket durations", _close(summed, summed_true, tol),
                       f"{summed_true:.2f} ms: every all-reduce's launch-to-done, added up" if _close(summed, summed_true, tol)
                       else f"your trace's durations add up to {summed_true:.2f} ms; you wrote {summed:.2f}"))
    exposed_true = max(0.0, max(d for _, d in spans) - end)
    if _close(exposed, exposed_true, tol):
        msg = (f"{exposed_true:.2f} ms of communication still running when backward returned (of {summed_true:.2f} ms "
               f"summed: the rest ran beside backward)")
    elif _close(exposed, summed_true, tol):
        msg = (f"{exposed:.2f} ms is the sum of the buckets' durations; the exposed part is only what is still running "
               f"after backward returned: last done ({max(d for _, d in spans):.2f} ms) minus backward's end "
               f"({end:.2f} ms) = {exposed_true:.2f} ms, since the buckets overlap backward and each other")
    else:
        msg = (f"from your trace, the last bucket is done {exposed_true:.2f} ms after backward returned "
               f"(0 if before); you wrote {exposed:.2f}")
    out.append(Finding("buckets", "exposed communication (after backward returned)", _close(exposed, exposed_true, tol), msg))
    return out


# -- communication -------------------------------------------------------------------------------------

def _truth_payload(run) -> int:
    return sum(b.bytes for b in run.ranks[0].steps[-1].buckets)


def _judge_comm(ev, exp: Experiment, runs) -> list[Finding]:
    from .predict.comm import ring_bytes_per_rank

    run = runs["audit-hidden"]
    payload = _number(_get(ev, "payload_bytes", "comm"), "comm['payload_bytes']")
    per_rank = _get(ev, "bytes_per_rank", "comm")
    if not isinstance(per_rank, dict) or not per_rank:
        raise _Malformed("comm['bytes_per_rank']: {world size D: bytes each rank sends}")
    truth = _truth_payload(run)
    out = []
    batches = {exp.local_batches[0], exp.global_batch, exp.local_batches[0] * exp.accum_steps}
    if payload == truth:
        msg = f"{truth:,} bytes: every trainable gradient, whatever the batch (the gradient has the parameters' shape)"
    elif any(payload == truth * b for b in batches) or (payload > truth and (payload / truth) in batches):
        msg = (f"{payload:,.0f} bytes grows with the batch; the payload is the gradient, which has the parameters' "
               f"shape however many examples produced it: {truth:,} bytes")
    else:
        msg = f"one step all-reduces every trainable gradient once: {truth:,} bytes; you wrote {payload:,.0f}"
    out.append(Finding("comm", "payload of one step's all-reduce", payload == truth, msg))
    measured = [s.write_bytes for r in run.ranks for s in r.steps[1:] if s.write_bytes is not None]
    model_d = ring_bytes_per_rank(truth, exp.world_size)
    slack = max(abs(m - model_d) for m in measured) / model_d if measured else 0.0
    ds = {int(k): v for k, v in per_rank.items()}
    if exp.world_size not in ds or not any(d > 2 for d in ds):
        out.append(Finding("comm", "bytes per rank: which world sizes", False,
                           f"give bytes_per_rank for the declared world size {exp.world_size} and for one D > 2 "
                           f"(at D = 2 the ring factor is 1, so a missing factor would not show)"))
    for d in sorted(ds):
        v = _number(ds[d], f"comm['bytes_per_rank'][{d}]")
        model = ring_bytes_per_rank(truth, d)
        tol = max(1.0, model * (1.5 * slack + 0.01)) if d == exp.world_size else 1.0
        ok = abs(v - model) <= tol
        if ok:
            msg = (f"{model:,.0f} bytes = 2(D-1)/D x payload" + (f" (measured on this run within {slack:.1%})"
                                                                  if d == exp.world_size and measured else ""))
        elif d > 2 and (abs(v - truth) <= tol or abs(v - 2 * truth) <= tol or abs(v - truth * 2 * (d - 1)) <= tol):
            msg = (f"at D = {d} {v:,.0f} bytes leaves out the ring factor: a ring all-reduce sends each of the D chunks "
                   f"2(D-1) times around, so a rank sends 2(D-1)/D x payload = {model:,.0f} bytes")
        else:
            msg = f"at D = {d} a ring all-reduce of {truth:,} bytes sends 2(D-1)/D x payload = {model:,.0f} bytes per rank; you wrote {v:,.0f}"
        out.append(Finding("comm", f"bytes each rank sends at D = {d}", ok, msg))
    return out


JUDGES = {"batch": _judge_batch, "memory": _judge_memory, "gradients": _judge_gradients,
          "readiness": _judge_readiness, "buckets": _judge_buckets, "comm": _judge_comm}

HINTS = {
    "batch": "the local batch of every rank, the accumulation steps, and the global batch they make",
    "memory": "a table {rank: {parameters, gradients, optimizer_state, activations}} in bytes, read off the run's memory ledger",
    "gradients": "a check case with unequal local batches (audit.check_case): local, reduced and global-batch values of one element",
    "readiness": "the parameter names in the order their gradients became ready (the readiness probe)",
    "buckets": "rank 0's bucket trace of the last step, its summed durations and its exposed part",
    "comm": "the bytes one step all-reduces, and the bytes each rank sends in a ring all-reduce",
}

MISTAKES = {   # the classic wrong evidence each piece catches with its own message (tests/test_audit.py)
    "memory divided by the world size": "memory",
    "unweighted mean of rank means with unequal batches": "gradients",
    "source order reported as ready order": "readiness",
    "summed bucket durations reported as exposed time": "buckets",
    "a payload that scales with the local batch": "comm",
    "global batch without the accumulation factor": "batch",
    "bytes per rank without the ring factor 2(D-1)/D": "comm",
}
