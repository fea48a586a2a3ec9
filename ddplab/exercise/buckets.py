"""The bucket trace (rank 0, last step, ms after its backward began): each bucket's bytes, launch and
completion, their summed durations, and the exposed tail: the wait from the end of backward's compute
(the last gradient ready) until the last all-reduce is done (`record.exposed_tail_ms`). Not from
backward's return: on gloo backward returns only once every bucket's all-reduce is done, so nothing
is left by then. Bucket sizes and their order do not depend on the seed; the times are checked
against the learner's own trace, since every run's differ."""

from __future__ import annotations

from .report import Finding
from .shape import Malformed, fields, integer, number

MS_ROUNDING = 0.005   # a time written to two decimals of a millisecond
KEYS = ("count", "trace", "last_ready_ms", "summed_ms", "exposed_ms")
ROW = ("bytes", "launch_ms", "done_ms")   # one per bucket in the trace
HINT = "rank 0's bucket trace of the last step, its summed durations and its exposed tail"


def judge(ev, exp, runs) -> list[Finding]:
    ev = fields(ev, "buckets", KEYS)
    count = integer(ev["count"], "buckets['count']")
    trace = ev["trace"]
    if not isinstance(trace, list) or not trace:
        raise Malformed("buckets['trace']: a list of {'bytes', 'launch_ms', 'done_ms'}, one per bucket")
    rows = []
    for k, b in enumerate(trace):
        where = f"buckets['trace'][{k}]"
        b = fields(b, where, ROW)
        rows.append((integer(b["bytes"], f"{where}['bytes']"), number(b["launch_ms"], f"{where}['launch_ms']"),
                     number(b["done_ms"], f"{where}['done_ms']")))
    last_ready = number(ev["last_ready_ms"], "buckets['last_ready_ms']")
    summed = number(ev["summed_ms"], "buckets['summed_ms']")
    exposed = number(ev["exposed_ms"], "buckets['exposed_ms']")
    hidden = [b.bytes for b in runs["exercise-hidden"].ranks[0].steps[-1].buckets]
    out = [Finding("buckets", "how many buckets DDP built", count == len(hidden) == len(trace),
                   f"{len(hidden)} buckets in every step after the first (DDP rebuilds them from the ready order)"
                   if count == len(hidden) == len(trace) else
                   f"you wrote {count} and traced {len(trace)}; that is not how many buckets DDP built for this "
                   f"network at bucket_cap_mb={exp.bucket_cap_mb} (count st.buckets)")]
    mine = [b for b, _, _ in rows]
    off = next((k for k, (a, t) in enumerate(zip(mine, hidden)) if a != t), min(len(mine), len(hidden)))
    out.append(Finding("buckets", "each bucket's bytes, in launch order", mine == hidden,
                       f"{', '.join(f'{b:,}' for b in hidden)} bytes: DDP launches its buckets in order" if mine == hidden
                       else f"DDP's buckets do not hold the bytes your trace has, in that order; the first that "
                            f"differs is bucket {off} (read .bytes of each of st.buckets, in order)"))
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
    ok = summed_ok = abs(summed - summed_true) <= tol
    out.append(Finding("buckets", "summed bucket durations", ok,
                       f"{summed_true:.2f} ms: every all-reduce's launch-to-done, added up" if ok else
                       f"{summed:.2f} ms is not what your trace's durations add up to: add done_ms - launch_ms over "
                       f"every bucket"))
    last_launch = max(a for _, a, _ in rows)   # the last bucket holds the last gradient: it cannot launch before that is ready
    ok = last_ready <= last_launch + tol
    out.append(Finding("buckets", "the last gradient ready before the last bucket launched", ok,
                       f"your last gradient at {last_ready:.2f} ms, your last bucket launched at {last_launch:.2f} ms"
                       if ok else
                       f"last_ready_ms is after your last bucket's launch, but that bucket waits for the last gradient: "
                       f"read the last ready time off the readiness events (st.backward.ready), not backward()'s return"))
    end = max(d for _, _, d in rows)
    exposed_true = max(0.0, end - last_ready)
    ok = abs(exposed - exposed_true) <= tol
    if ok:
        msg = (f"{exposed_true:.2f} ms of communication still running after the last gradient was ready"
               + (f", of {summed_true:.2f} ms summed" if summed_ok else "")   # never another row's answer
               + ": the rest overlapped backward's compute, or another bucket")
    elif summed_ok and abs(exposed - summed_true) <= tol:   # said only once the summed row is right: its answer
        msg = (f"{exposed:.2f} ms is the sum of the buckets' durations; the buckets overlap backward and each other, "
               f"so the exposed tail is only the wait after the last gradient was ready: the last done_ms minus "
               f"last_ready_ms (0 if it was done before)")
    else:
        msg = (f"{exposed:.2f} ms is not what your trace gives: the exposed tail is the last done_ms minus "
               f"last_ready_ms (0 if it was done before)")
    out.append(Finding("buckets", "exposed tail (after the last gradient was ready)", ok, msg))
    return out
