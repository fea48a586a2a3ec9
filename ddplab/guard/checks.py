"""What the guard concludes from one check's reports, one per rank (pure: no torch, no process group).

Every rank reads the same reports and runs the same code, so every rank finds the same problems at the
same step, and all of them raise together (no rank is left waiting in a collective for one that gave
up). A report is a dict (`hooks.Guard` builds it):

    rank, step        who and when (the optimizer step just taken, counted from 0)
    layout            a digest of the parameter and buffer names (models that differ cannot be compared)
    batches           a fingerprint per forward of this step (`fingerprint.batch_fingerprint`)
    grads             a fingerprint per parameter's gradient just before the step (None: no gradient)
    params            a fingerprint per parameter just after the step
    buffers           a fingerprint per buffer as the step's first forward saw it (after DDP's broadcast)
    no_sync           this step's last forward ran with DDP's gradient synchronization off (`no_sync`)
    loss              None, or {value, reduction, denominator, scale}: `fingerprint.loss_reduction`
    sampler           the sampler's epochs started since the last check: {epoch, order, n, padded, dropped}

`static` describes the model the same way on every rank: parameter names, which of them DDP does not
hold (the optimizer updates them, DDP never reduces their gradients), which of those the module gained
after DDP wrapped it (`late`), buffer names and their modules.
"""

from __future__ import annotations

from dataclasses import dataclass

ERROR, NOTE = "error", "note"


@dataclass(frozen=True)
class Problem:
    kind: str
    step: int
    ranks: tuple[int, ...]
    message: str
    severity: str = ERROR

    def __str__(self) -> str:
        return f"ddplab.guard, step {self.step}: {self.message}"


# said with every verdict that a rank stopped stepping: a rank working alone between steps looks the same
ALONE_HINT = "if a rank works alone between steps (evaluation, saving), raise timeout_s above that time"


def ranks_text(rs) -> str:
    """"rank 1", "ranks 0 and 2", "ranks 0, 2 and 3"."""
    rs = sorted(rs)
    return f"rank {rs[0]}" if len(rs) == 1 else "ranks " + ", ".join(map(str, rs[:-1])) + f" and {rs[-1]}"


def _names(names: list[str], limit: int = 3) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _differing(reports: list[dict], key: str) -> list[int]:
    """Indices where the ranks' fingerprints under `key` are not all equal."""
    rows = [r[key] for r in reports]
    if any(row is None for row in rows):
        return []
    return [i for i in range(len(rows[0])) if len({str(row[i]) for row in rows}) > 1]


def _groups(reports: list[dict], key: str, i: int) -> str:
    """Which ranks agree on item i: "ranks 0 and 2 against rank 1"."""
    by: dict[str, list[int]] = {}
    for r in reports:
        by.setdefault(str(r[key][i]), []).append(r["rank"])
    return " against ".join(ranks_text(g) for g in sorted(by.values(), key=lambda g: (-len(g), g)))


def same_batches(reports: list[dict], step: int) -> list[Problem]:
    seen: dict[str, set[int]] = {}
    for r in reports:
        for fp in r["batches"]:
            seen.setdefault(str(fp), set()).add(r["rank"])
    shared = sorted({tuple(sorted(rs)) for rs in seen.values() if len(rs) > 1})
    if not shared:
        return []
    ranks = tuple(sorted({x for g in shared for x in g}))
    groups = "; ".join(ranks_text(g) for g in shared)
    return [Problem("same-batch", step, ranks,
                    f"{groups} got the same batch. Data parallelism only pays if each rank reads a different part "
                    "of the data; with the same batch on every rank, the step costs W times the compute for one "
                    "rank's learning. Give each rank its own shard: a DistributedSampler (with the rank and world "
                    "size), or a dataset split by rank.")]


def unsynced_gradients(reports: list[dict], static: dict, step: int) -> list[Problem]:
    bad = _differing(reports, "grads")
    if not bad:
        return []
    names = [static["params"][i] for i in bad]
    late = [static["params"][i] for i in bad if static.get("late", [False] * len(static["params"]))[i]]
    outside = [static["params"][i] for i in bad if static["outside"][i] and static["params"][i] not in late]
    if late:
        one = len(late) == 1
        why = (f"{_names(late)} {'was' if one else 'were'} registered on the model after DDP wrapped it: DDP reduces "
               "the parameters the module held when DDP was built, so it does not reduce "
               f"{'this one' if one else 'these'}. Register every parameter before wrapping the module in DDP "
               "(or wrap it again).")
    elif outside:
        one = len(outside) == 1
        why = (f"{'it is' if one else f'{len(outside)} of them are'} in the optimizer but not among the parameters "
               f"DDP averages ({_names(outside)}: outside the DDP model, or in its parameters_to_ignore), so nothing "
               f"averages {'its' if one else 'their'} gradients. Put the module that holds {'it' if one else 'them'} "
               "inside the DDP model (one DDP around the whole model).")
    elif any(r["no_sync"] for r in reports):
        why = ("the step's last backward ran inside `model.no_sync()`, so DDP skipped its all-reduce. With gradient "
               "accumulation, run every micro-batch but the last inside no_sync, and the last one outside it.")
    elif not static["ddp"]:
        why = "the model is not wrapped in DDP and nothing averaged the gradients across ranks."
    else:
        why = "something changed the gradients after DDP averaged them, on some ranks only (a hook, clipping on one rank)."
    ranks = tuple(sorted({r["rank"] for r in reports}))
    return [Problem("unsynced-gradients", step, ranks,
                    f"the gradients of {_names(names)} differ between ranks before the optimizer step "
                    f"({_groups(reports, 'grads', bad[0])} for {names[0]}): {why}")]


def replicas(reports: list[dict], static: dict, step: int, gradients_differ: bool) -> list[Problem]:
    bad = _differing(reports, "params")
    if not bad:
        return []
    names = [static["params"][i] for i in bad]
    why = ("they got different gradients (above)." if gradients_differ else
           "the gradients agreed, so the replicas differed before this step or the update differs by rank "
           "(a rank-dependent learning rate or optimizer state; a parameter initialised differently on each rank "
           "and kept outside DDP, which broadcasts rank 0's parameters only when it is built).")
    return [Problem("replicas-differ", step, tuple(sorted({r["rank"] for r in reports})),
                    f"the replicas differ after the optimizer step: {_names(names)} "
                    f"({_groups(reports, 'params', bad[0])} for {names[0]}): {why}")]


def buffers(reports: list[dict], static: dict, step: int) -> list[Problem]:
    bad = _differing(reports, "buffers")
    if not bad:
        return []
    names = [static["buffers"][i] for i in bad]
    owners = sorted({static["buffer_owners"][i] for i in bad})
    fix = ("leave DDP's buffer sync on (drop broadcast_buffers=False; DDP's newer name for it "
           "is forward_sync_buffers=True): rank 0's buffers are then copied to every rank before each forward; "
           "or convert the model with nn.SyncBatchNorm.convert_sync_batchnorm so the statistics cover the global batch"
           if any("BatchNorm" in o for o in owners) else
           "leave DDP's buffer sync on (drop broadcast_buffers=False), or update the buffers the same way on every rank")
    return [Problem("buffers-differ", step, tuple(sorted({r["rank"] for r in reports})),
                    f"the buffers {_names(names)} ({', '.join(owners)}) differ between ranks as the forward sees them "
                    f"({_groups(reports, 'buffers', bad[0])} for {names[0]}): each rank updates them from its own "
                    f"batch and nothing makes them agree; evaluation and checkpoints then depend on the rank. Fix: {fix}.")]


LOSS_TOLERANCE = 0.05   # examples weighing up to 5% apart are a note (padding, ignored targets), beyond it an error


def loss_weights(reports: list[dict], step: int) -> list[Problem]:
    """DDP averages the ranks' gradients, so rank r's examples weigh scale_r / denominator_r (mean) or
    scale_r (sum) each: unequal weights mean the step optimizes a skewed average."""
    losses = [r["loss"] for r in reports]
    if any(x is None or x["reduction"] not in ("mean", "sum") or not x["denominator"] for x in losses):
        return []
    weights = [x["scale"] / (x["denominator"] if x["reduction"] == "mean" else 1.0) for x in losses]
    lo, hi = min(weights), max(weights)
    if lo <= 0 or hi / lo <= 1 + 1e-6:
        return []
    light, heavy = weights.index(lo), weights.index(hi)
    counts = ", ".join(f"rank {r['rank']} over {x['denominator']:g}" for r, x in zip(reports, losses))
    ddp_loss = sum(x["value"] for x in losses) / len(losses)
    # each rank's loss summed over its own examples (or tokens), before any scaling
    sums = [x["value"] / x["scale"] * (x["denominator"] if x["reduction"] == "mean" else 1.0) for x in losses]
    total = sum(x["denominator"] for x in losses)
    severity = ERROR if hi / lo - 1 > LOSS_TOLERANCE else NOTE
    return [Problem("loss-weights", step, (reports[light]["rank"], reports[heavy]["rank"]),
                    f"the ranks weigh their examples differently: the loss is normalized per rank ({counts}: "
                    f"examples, or tokens and target weights where the loss ignores or weighs targets) and DDP then "
                    f"averages the ranks, so each example (or token) of rank {reports[heavy]['rank']} counts "
                    f"{hi / lo:.2f}x one of rank {reports[light]['rank']}. This step's loss as DDP weighs it is "
                    f"{ddp_loss:.4g}; the mean over all {total:g} is {sum(sums) / total:.4g}. Fix: sum the loss "
                    "(reduction='sum'), divide it by the count summed over ranks (all_reduce it) and multiply by the "
                    "world size; or give every rank as many examples (or tokens)."
                    + ("" if severity == ERROR else f" (Within {LOSS_TOLERANCE:.0%}: a note, not an error.)"),
                    severity)]


def sampler(reports: list[dict], step: int) -> list[Problem]:
    problems = []
    repeated = [r["rank"] for r in reports if any(e.get("repeats") for e in r["sampler"])]
    if repeated:
        event = next(e for r in reports for e in r["sampler"] if e.get("repeats"))
        problems.append(Problem(
            "sampler-repeats", step, tuple(repeated),
            f"{ranks_text(repeated)} began pass {event['pass'] + 1} over the data in the same order as pass "
            f"{event['pass']} (the sampler's epoch is still {event['epoch']}): a DistributedSampler shuffles with its "
            "seed plus its epoch, so without `sampler.set_epoch(epoch)` before each epoch every epoch repeats the "
            "first one's order."))
    first = next((e for r in reports for e in r["sampler"] if e.get("first")), None)
    if first is not None and (first["padded"] or first["dropped"]):
        k = first["padded"] or first["dropped"]
        some = f"{k} example{' is' if k == 1 else 's are'}"
        what = (f"{some} read twice per epoch (the sampler pads the dataset so every rank gets {first['n']})"
                if first["padded"] else
                f"{some} never read (drop_last=True trims the dataset so every rank gets {first['n']})")
        problems.append(Problem("sampler-uneven", step, tuple(r["rank"] for r in reports),
                                f"{what}; a metric averaged over the epoch counts them accordingly.", NOTE))
    return problems


def find_problems(reports: list[dict], static: dict) -> list[Problem]:
    """Every problem these reports (one per rank, one step) show, errors first."""
    reports = sorted(reports, key=lambda r: r["rank"])
    step = reports[0]["step"]
    if len({r["layout"] for r in reports}) > 1:
        return [Problem("models-differ", step, tuple(r["rank"] for r in reports),
                        "the ranks hold models with different parameters or buffers (names or shapes), so they are "
                        "not replicas: build the same model on every rank.")]
    grads = unsynced_gradients(reports, static, step)
    found = (same_batches(reports, step) + grads + replicas(reports, static, step, bool(grads))
             + buffers(reports, static, step) + loss_weights(reports, step) + sampler(reports, step))
    return sorted(found, key=lambda p: p.severity != ERROR)
