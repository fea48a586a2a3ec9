"""Local and reduced gradients of a small check case, and the convention that turns the first into the
global-batch gradient. Values depend on the seed, so they are checked against a re-run of the
learner's own check case (bit for bit, up to float32 rounding of the written value); the convention
is called on a hidden case (another seed, other unequal batches) and must give the one-process gradient."""

from __future__ import annotations

from .report import Finding
from .shape import Malformed, batches, fields, integer, number, numbers_list

FLOAT32_EPS = 2.0 ** -23
KEYS = ("local_batch", "parameter", "element", "local", "reduced", "global_batch_gradient")
OPTIONAL = ("convention",)   # left out (None or ...), the values are checked and the convention is todo
HINT = ("a check case with unequal local batches (exercise.check_case): local, reduced and global-batch "
        "values of one element, and the convention as a function")
CONVENTION = "your convention, on a hidden case"


def case_batches(ev, world_size: int):
    """The check case's local batches, or the Finding that says why they will not do."""
    try:
        b = batches(fields(ev, "gradients", KEYS, OPTIONAL)["local_batch"], "gradients['local_batch']", world_size)
    except Malformed as e:
        return Finding("gradients", "shape", False, str(e))
    if len(set(b)) == 1:
        return Finding("gradients", "unequal local batches", False,
                       f"the check case's local batches are all {b[0]}: with equal batches the weighted and the "
                       f"unweighted mean coincide, so the case cannot tell the conventions apart; give the ranks "
                       f"different batches, e.g. {[1 + 2 * r for r in range(world_size)]}")
    return b


def hidden_batches(b: list[int]) -> list[int]:
    """Other unequal batches for the hidden case: the learner's, rotated, one example more on rank 0."""
    out = b[1:] + b[:1]
    out[0] += 1
    if len(set(out)) == 1:   # [k+1, k] rotates to [k+1, k+1]
        out[-1] += 1
    return out


def judge(ev, exp, runs) -> list[Finding]:
    ev = fields(ev, "gradients", KEYS, OPTIONAL)
    run = runs["exercise-your-case"]
    b = run.spec.local_batches
    name = ev["parameter"]
    i = integer(ev["element"], "gradients['element']")
    ts = [run.tensors(r.rank) for r in run.ranks]
    if not isinstance(name, str) or name not in ts[0]["reference"]:
        raise Malformed(f"gradients['parameter']: {name!r} is not a trainable parameter of the declared network "
                        f"(they are {', '.join(list(ts[0]['reference'])[:6])}, ...)")
    if not 0 <= i < ts[0]["reference"][name].numel():
        raise Malformed(f"gradients['element']: {name} has {ts[0]['reference'][name].numel()} elements; got {i}")
    local_true = [float(t["local"][name].flatten()[i]) for t in ts]
    reduced_true = float(ts[0]["reduced"][name].flatten()[i])
    ref_true = float(ts[0]["reference"][name].flatten()[i])
    scale = max(abs(v) for v in local_true + [ref_true]) or 1.0
    tol = 16 * FLOAT32_EPS * scale * exp.world_size   # between sums of D float32 terms done in other orders

    def same(mine: float, truth: float) -> bool:
        """A value the re-run reproduces bit for bit: only its float32 rounding may differ."""
        return abs(mine - truth) <= 8 * FLOAT32_EPS * max(abs(truth), 1e-3 * scale)

    local = numbers_list(ev["local"], "gradients['local']", exp.world_size)
    reduced = number(ev["reduced"], "gradients['reduced']")
    glob = number(ev["global_batch_gradient"], "gradients['global_batch_gradient']")
    bad = [r for r in range(exp.world_size) if not same(local[r], local_true[r])]
    out = [Finding("gradients", "every rank's local gradient", not bad,
                   f"{name}[{i}] on each rank matches a re-run of your check case" if not bad else
                   f"rank {bad[0]}'s local gradient of {name}[{i}] in a re-run of your check case (seed {exp.seed}, "
                   f"local batches {b}) is not the {local[bad[0]]:.9g} you wrote, beyond float32 rounding: read it "
                   f"with float(...) off case.tensors({bad[0]})['local'], not off a printed table")]
    ok = reduced_ok = same(reduced, reduced_true)
    if ok:
        msg = (f"{reduced_true:.9g}: the mean of the {exp.world_size} local gradients (DDP sums them and divides by "
               f"the world size, folding 1/{exp.world_size} into the copy into the bucket)")
    elif abs(reduced - sum(local_true)) <= tol * exp.world_size:
        msg = (f"{reduced:.9g} is the sum of the local gradients: DDP divides the sum by the world size, so every "
               f"rank holds their mean")
    else:
        msg = (f"{reduced:.9g} is not DDP's reduced {name}[{i}]: read what DDP left in .grad, "
               f"case.tensors(r)['reduced'] (the same on every rank)")
    out.append(Finding("gradients", "DDP's reduced gradient", ok, msg))
    mean = sum(local_true) / len(local_true)
    ok = same(glob, ref_true)
    if ok:
        msg = (f"{ref_true:.9g}: the one-process gradient of all {sum(b)} examples; DDP's reduced value"
               + (f" ({reduced_true:.9g})" if reduced_ok else "")   # never another row's answer, nor the convention's rule
               + " differs from it because the batches are unequal")
    elif abs(glob - mean) <= tol and reduced_ok:   # named only once the reduced row is right: it is that value
        msg = (f"this is the unweighted mean of the ranks' mean gradients (DDP's reduced value): with unequal local "
               f"batches a rank with more examples must count more in what one process computes on all {sum(b)} examples")
    elif abs(glob - mean) <= tol:   # the same mistake, said without confirming the reduced row's answer
        msg = (f"not what one process computes on all {sum(b)} examples: with unequal local batches a rank with more "
               f"examples must count more than one with fewer")
    else:
        msg = (f"{glob:.9g} is not what one process computes on all {sum(b)} examples: read it off rank 0's "
               f"case.tensors(0)['reference']")
    out.append(Finding("gradients", "the global-batch gradient", ok, msg))
    conv = ev.get("convention")
    if conv is None or conv is Ellipsis:
        out.append(Finding("gradients", CONVENTION, None,
                           "not filled in yet: gradients['convention'] = a function of (local values, local batches) "
                           "that returns the global-batch gradient"))
    elif not callable(conv):
        out.append(Finding("gradients", CONVENTION, False, f"gradients['convention']: a function, got {conv!r}"))
    else:
        out.append(_judge_convention(conv, runs["exercise-hidden-case"], name))
    return out


def _judge_convention(conv, run, name: str) -> Finding:
    ts = [run.tensors(r.rank) for r in run.ranks]
    b = list(run.spec.local_batches)
    locals_ = [t["local"][name].flatten().tolist() for t in ts]
    ref = ts[0]["reference"][name].flatten().tolist()
    n = min(len(ref), 64)
    scale = max(max(abs(v) for v in ref[:n]), max(abs(v) for col in locals_ for v in col[:n])) or 1.0
    tol = 16 * FLOAT32_EPS * scale * len(b)
    try:
        got = [float(conv([col[i] for col in locals_], list(b))) for i in range(n)]
    except Exception as e:  # noqa: BLE001 - the learner's function: its error is feedback
        return Finding("gradients", CONVENTION, False,
                       f"calling it on local values and batches {b} raised {type(e).__name__}: {e}")
    where = max(range(n), key=lambda i: abs(got[i] - ref[i]))
    if abs(got[where] - ref[where]) <= tol:
        return Finding("gradients", CONVENTION, True,
                       f"on a case you did not see (local batches {b}, another seed) it gives the one-process gradient")
    col = [c[where] for c in locals_]
    hint = " (that is the unweighted mean: a rank with more examples must count more)" \
        if abs(got[where] - sum(col) / len(col)) <= tol else ""
    return Finding("gradients", CONVENTION, False,
                   f"on a hidden case (local batches {b}) your function gives {got[where]:.9g} for element {where}, "
                   f"which is not the one-process gradient{hint}")
