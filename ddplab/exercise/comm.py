"""Communication bytes: the payload one step all-reduces (every trainable gradient, whatever the batch)
and, modelled, what each rank sends in a ring all-reduce of it: 2(D-1)/D x payload (a reduce-scatter
and an all-gather, each sending (D-1)/D of it). Asked for the declared world size and one D > 2, since
at D = 2 the factor is 1 and leaving it out would not show."""

from __future__ import annotations

from .report import Finding
from .shape import Malformed, fields, number

KEYS = ("payload_bytes", "bytes_per_rank")
HINT = "the bytes one step all-reduces, and the bytes each rank sends in a ring all-reduce of it"


def judge(ev, exp, runs) -> list[Finding]:
    from ..predict.comm import ring_bytes_per_rank

    ev = fields(ev, "comm", KEYS)
    payload = number(ev["payload_bytes"], "comm['payload_bytes']")
    per_rank = ev["bytes_per_rank"]
    if not isinstance(per_rank, dict) or not per_rank:
        raise Malformed("comm['bytes_per_rank']: {world size D: bytes each rank sends}")
    try:
        ds = {int(k): v for k, v in per_rank.items()}
    except (TypeError, ValueError):
        raise Malformed(f"comm['bytes_per_rank']: keys are world sizes (2, 4, ...), got {list(per_rank)}") from None
    truth = sum(b.bytes for b in runs["exercise-hidden"].ranks[0].steps[-1].buckets)
    sizes = {exp.local_batches[0], exp.global_batch, exp.local_batches[0] * exp.accum_steps, sum(exp.local_batches)}
    if payload == truth:
        msg = f"{truth:,} bytes: every trainable gradient, whatever the batch (the gradient has the parameters' shape)"
    elif payload > truth and any(payload == truth * b for b in sizes):
        msg = (f"{payload:,.0f} bytes grows with the batch; the payload is the gradient, which has the parameters' "
               f"shape however many examples produced it")
    else:
        msg = (f"{payload:,.0f} bytes is not one step's payload: a step all-reduces every trainable gradient once "
               f"(add up the buckets' .bytes)")
    out = [Finding("comm", "payload of one step's all-reduce", payload == truth, msg)]
    if exp.world_size not in ds or not any(d > 2 for d in ds):
        out.append(Finding("comm", "bytes per rank: which world sizes", False,
                           f"give bytes_per_rank for the declared world size {exp.world_size} and for one D > 2 "
                           f"(at D = 2 the ring factor is 1, so a missing factor would not show)"))
    for d in sorted(ds):
        if d < 1:
            raise Malformed(f"comm['bytes_per_rank']: world sizes are 1 or more, got {d}")
        v = number(ds[d], f"comm['bytes_per_rank'][{d}]")
        model = ring_bytes_per_rank(truth, d)
        ok = abs(v - model) <= 1.0   # a byte count, written as a float
        if ok:
            msg = (f"{model:,.0f} bytes, what one rank sends in a ring all-reduce of the payload" if payload == truth else
                   "right for this D")   # no rule (other D rows), and no number while the payload row fails: at D = 2 it is the payload
        elif d > 2 and any(abs(v - x) <= 1.0 for x in (truth, 2 * truth, truth * 2 * (d - 1))):
            msg = (f"at D = {d} {v:,.0f} bytes leaves out the ring factor: a ring all-reduce is a reduce-scatter and "
                   f"an all-gather; count what one rank sends in each, in chunks of the payload")
        elif payload != truth and abs(v - ring_bytes_per_rank(payload, d)) <= 1.0:
            msg = (f"at D = {d} {v:,.0f} bytes follows the right rule from the payload you wrote; but the payload "
                   f"itself is wrong (see above)")
        else:
            msg = (f"at D = {d} {v:,.0f} bytes is not what each rank sends in a ring all-reduce of the payload: "
                   f"count what one rank sends in the reduce-scatter and in the all-gather")
        out.append(Finding("comm", f"bytes each rank sends at D = {d}", ok, msg))
    return out
