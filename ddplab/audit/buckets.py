"""The bucket trace (rank 0, last step, ms after its backward began): each bucket's bytes, launch and
completion, their summed durations, and the exposed tail: the communication still running after the
last gradient was ready. (Not after backward returned: DDP's backward waits for every bucket before it
returns, so by then nothing is left.) Bucket sizes and their order do not depend on the seed."""

from __future__ import annotations

from .report import Finding
from .shape import Malformed, get, integer, number

MS_ROUNDING = 0.005   # a time written to two decimals of a millisecond
HINT = "rank 0's bucket trace of the last step, its summed durations and its exposed tail"


def judge(ev, exp, runs) -> list[Finding]:
    count = integer(get(ev, "count", "buckets"), "buckets['count']")
    trace = get(ev, "trace", "buckets")
    if not isinstance(trace, list) or not trace:
        raise Malformed("buckets['trace']: a list of {'bytes', 'launch_ms', 'done_ms'}, one per bucket")
    rows = []
    for k, b in enumerate(trace):
        where = f"buckets['trace'][{k}]"
        rows.append((integer(get(b, "bytes", where), f"{where}['bytes']"),
                     number(get(b, "launch_ms", where), f"{where}['launch_ms']"),
                     number(get(b, "done_ms", where), f"{where}['done_ms']")))
    last_ready = number(get(ev, "last_ready_ms", "buckets"), "buckets['last_ready_ms']")
    summed = number(get(ev, "summed_ms", "buckets"), "buckets['summed_ms']")
    exposed = number(get(ev, "exposed_ms", "buckets"), "buckets['exposed_ms']")
    hidden = [b.bytes for b in runs["audit-hidden"].ranks[0].steps[-1].buckets]
    out = [Finding("buckets", "how many buckets DDP built", count == len(hidden) == len(trace),
                   f"{len(hidden)} buckets in every step after the first (DDP rebuilds them from the ready order)"
                   if count == len(hidden) == len(trace) else
                   f"DDP built {len(hidden)} buckets for this network at bucket_cap_mb={exp.bucket_cap_mb}; you wrote "
                   f"{count} and traced {len(trace)}")]
    mine = [b for b, _, _ in rows]
    out.append(Finding("buckets", "each bucket's bytes, in launch order", mine == hidden,
                       f"{', '.join(f'{b:,}' for b in hidden)} bytes: DDP launches its buckets in order" if mine == hidden
                       else f"DDP's buckets hold {hidden} bytes, launched in that order; your trace has {mine}"))
    backwards = [k for k, (_, a, d) in enumerate(rows) if d < a]
    disorder = [k for k in range(1, len(rows)) if rows[k][1] < rows[k - 1][1]]
    ok = not backwards and not disorder
    out.append(Finding("buckets", "every bucket starts after the one before and ends after it starts", ok,
                       "launches in order, each done after its launch" if ok else
                       (f"bucket {backwards[0]} is done before its launch: the columns are swapped or from different "
                        f"clocks" if backwards else
                        f"bucket {disorder[0]} launches before bucket {disorder[0] - 1}: DDP launches them in order")))
    tol = MS_ROUNDING * (2 * len(rows) + 1)   # every time rounded, and the sum of them
    summed_true = sum(d - a for _, a, d in rows)
    ok = abs(summed - summed_true) <= tol
    out.append(Finding("buckets", "summed bucket durations", ok,
                       f"{summed_true:.2f} ms: every all-reduce's launch-to-done, added up" if ok else
                       f"your trace's durations add up to {summed_true:.2f} ms; you wrote {summed:.2f}"))
    end = max(d for _, _, d in rows)
    exposed_true = max(0.0, end - last_ready)
    ok = abs(exposed - exposed_true) <= tol
    if ok:
        msg = (f"{exposed_true:.2f} ms of communication still running after the last gradient was ready, of "
               f"{summed_true:.2f} ms summed: the rest overlapped backward's compute, or another bucket")
    elif abs(exposed - summed_true) <= tol:
        msg = (f"{exposed:.2f} ms is the sum of the buckets' durations; what backward could not hide is only what is "
               f"still running after the last gradient was ready: last done ({end:.2f} ms) minus last ready "
               f"({last_ready:.2f} ms) = {exposed_true:.2f} ms, since the buckets overlap backward and each other")
    else:
        msg = (f"from your trace, the last bucket is done {exposed_true:.2f} ms after the last gradient was ready "
               f"(0 if before); you wrote {exposed:.2f}")
    out.append(Finding("buckets", "exposed tail (after the last gradient was ready)", ok, msg))
    return out
