"""The bucket simulator: from gradient-ready times, a bucket plan and a cost model to a predicted
schedule (pure: no processes, no torch).

Inputs, all measured on the learner's machine:
- `Grad`s in the order their gradients became ready, with bytes and ready time (ms after backward
  started) from a backward that ran without communication (the readiness probe);
- a plan: lists of parameter names, one list per bucket. `ddp_plan` builds DDP's own (walk the ready
  order, close a bucket once it holds at least the cap); `split_bucket` cuts one bucket in two;
- a `Cost`: the fitted alpha-beta line of an isolated all-reduce, and how communication and backward
  slow each other down when they run at the same time.

`simulate` plays the step forward in time. A bucket is launched the moment its last gradient is
ready, but never before the bucket ahead of it in the plan (DDP starts buckets in order); buckets go
through one communication channel in launch order, one all-reduce at a time (NCCL's picture; gloo
can run two at once, which the channel does not model).
Backward compute and communication each progress at full speed when alone; while both run, each
progresses at 1 / (1 + interference) of its speed:
- interference = 0 is the textbook picture (perfect overlap, communication is free while backward
  runs);
- interference = 1 is one core shared by both: every millisecond of communication costs a
  millisecond of compute somewhere, so overlap hides nothing (each rank of a CPU run with as many
  ranks as cores is in this regime).
`comm_scale` multiplies every all-reduce's isolated cost, and `copy_bytes_per_s`, when given, adds
the copy of each bucket's gradients into its flat buffer and back (DDP's default,
gradient_as_bucket_view=False; True removes it) to the bucket's cost. DDP really copies in on the
autograd thread and out after the last all-reduce; charging both to the channel is exact for the
step time when interference is 1 (then the total work is what counts), an approximation otherwise.
On an emulated link (spec/link.py), `link_hold` (`Link.alpha_beta`) adds a second stage after the
channel, as `rank/link.py` runs it: each all-reduce, once done, is held for the link's wire time, one
transfer at a time in the order they finished; the hold takes no core, so no interference. `calibrate` fits one knob (interference,
comm_scale or the link's alpha) on one measured point. Used by notebook 05 and the bucket slider,
where it must redraw in well under 50 ms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from .comm import AlphaBeta

_EPS = 1e-9


@dataclass(frozen=True)
class Grad:
    """One parameter's gradient: name, bytes, and when it became ready (ms after backward started)."""

    name: str
    bytes: int
    ready_ms: float


@dataclass(frozen=True)
class Cost:
    """How long communication takes and how it interferes with backward (see the module docstring)."""

    link: AlphaBeta
    interference: float = 0.0
    comm_scale: float = 1.0
    copy_bytes_per_s: float | None = None
    link_hold: AlphaBeta | None = None   # an emulated link's wire time after each all-reduce (known, not fitted)

    def __post_init__(self):
        for name in ("interference", "comm_scale"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"Cost.{name}: must be a finite number >= 0 (got {v!r})")
        if self.copy_bytes_per_s is not None and not self.copy_bytes_per_s > 0:
            raise ValueError(f"Cost.copy_bytes_per_s: must be > 0 or None (got {self.copy_bytes_per_s!r})")

    def link_faster(self, times: float) -> "Cost":
        """This cost on an emulated link with `times` its bandwidth (the same latency); as it is without one."""
        if self.link_hold is None or times == 1:
            return self
        return replace(self, link_hold=replace(self.link_hold, beta_s_per_byte=self.link_hold.beta_s_per_byte / times))

    def allreduce_ms(self, n_bytes: int) -> float:
        """One bucket's cost alone: the all-reduce, scaled, plus its copies in and out (if priced)."""
        copy = 2 * n_bytes / self.copy_bytes_per_s if self.copy_bytes_per_s else 0.0
        return (self.comm_scale * self.link.predict(n_bytes) + copy) * 1e3


@dataclass(frozen=True)
class BucketTime:
    """One bucket in a simulated (or measured) step; times in ms after backward started."""

    index: int
    params: tuple[str, ...]
    bytes: int
    ready_ms: float      # launched: its last gradient is ready, and every bucket before it has been launched
    start_ms: float      # the channel takes it up (after the buckets launched before it)
    finish_ms: float
    cost_ms: float       # what it would take alone: comm_scale x alpha-beta, plus its copies if priced


@dataclass(frozen=True)
class Schedule:
    buckets: tuple[BucketTime, ...]
    backward_ms: float       # when backward compute ends (stretched by interference)
    comm_end_ms: float       # when the last all-reduce finishes
    forward_ms: float = 0.0
    optimizer_ms: float = 0.0

    @property
    def first_launch_ms(self) -> float:
        return min(b.ready_ms for b in self.buckets)

    @property
    def last_bucket(self) -> BucketTime:
        """The bucket launched last (the one left to run after backward, if any is)."""
        return max(self.buckets, key=lambda b: b.ready_ms)

    @property
    def exposed_tail_ms(self) -> float:
        """Communication still running after backward compute has ended."""
        return max(0.0, self.comm_end_ms - self.backward_ms)

    @property
    def summed_comm_ms(self) -> float:
        return sum(b.cost_ms for b in self.buckets)

    @property
    def sync_end_ms(self) -> float:
        """When gradients are synchronized: backward and communication both done."""
        return max(self.backward_ms, self.comm_end_ms)

    @property
    def step_ms(self) -> float:
        return self.forward_ms + self.sync_end_ms + self.optimizer_ms


def grads_in_ready_order(names, sizes, ready_ms) -> list[Grad]:
    """Build `Grad`s from parallel sequences, sorted by ready time (stable)."""
    grads = [Grad(n, int(b), float(t)) for n, b, t in zip(names, sizes, ready_ms, strict=True)]
    return sorted(grads, key=lambda g: g.ready_ms)


def ddp_plan(grads: list[Grad], cap_bytes: float, first_cap_bytes: float | None = None) -> list[list[str]]:
    """DDP's rebuilt buckets: walk the gradients in ready order and close a bucket as soon as it
    holds at least its cap (so a bucket overshoots by up to one tensor; a tensor is never split). The
    first bucket's cap is `first_cap_bytes` (DDP: 1 MiB when bucket_cap_mb is left at None, otherwise
    the same cap)."""
    if not cap_bytes > 0:
        raise ValueError(f"cap_bytes: must be > 0 (got {cap_bytes!r})")
    plan, current, size = [], [], 0
    for g in sorted(grads, key=lambda g: g.ready_ms):
        current.append(g.name)
        size += g.bytes
        limit = first_cap_bytes if (first_cap_bytes is not None and not plan) else cap_bytes
        if size >= limit:
            plan.append(current)
            current, size = [], 0
    if current:
        plan.append(current)
    return plan


def caps_for(plan: list[list[str]], sizes: dict[str, int]) -> list[float]:
    """`bucket_cap_mb_list` under which DDP's rebuild reproduces `plan`, a cut of the ready order into
    consecutive buckets: DDP closes a bucket once it holds at least its cap, so each bucket's cap is its
    own size (a power-of-two division: the bytes come back exact)."""
    return [sum(sizes[n] for n in bucket) / 2 ** 20 for bucket in plan]


def split_bucket(plan: list[list[str]], grads: list[Grad], index: int = -1, parts: int = 2) -> list[list[str]]:
    """Cut bucket `index` into `parts` buckets of consecutive ready order, each cut placed where the
    bytes before it come closest to an even share (a tensor is never split). The default cuts the
    last bucket, the one most likely to be exposed."""
    if parts < 1:
        raise ValueError(f"parts: must be >= 1 (got {parts!r})")
    index = index % len(plan)
    by_name = {g.name: g for g in grads}
    members = sorted(plan[index], key=lambda n: by_name[n].ready_ms)
    if len(members) < parts:
        raise ValueError(f"index: bucket {index} holds {len(members)} tensor(s), cannot split it into {parts}")
    sizes = [by_name[n].bytes for n in members]
    total, cuts, done, i = sum(sizes), [], 0, 0
    for k in range(1, parts):
        target = total * k / parts
        # take at least one tensor, and leave at least one for each piece still to come
        lo, hi = i + 1, len(members) - (parts - k)
        best = min(range(lo, hi + 1), key=lambda c: abs(done + sum(sizes[i:c]) - target))
        done += sum(sizes[i:best])
        cuts.append(best)
        i = best
    bounds = [0, *cuts, len(members)]
    pieces = [members[a:b] for a, b in zip(bounds, bounds[1:])]
    return plan[:index] + pieces + plan[index + 1:]


def check_plan(plan, grads: list[Grad]) -> None:
    """Every gradient in exactly one bucket, no empty bucket; else ValueError."""
    names = [g.name for g in grads]
    seen = [n for b in plan for n in b]
    if any(len(b) == 0 for b in plan):
        raise ValueError("plan: a bucket is empty")
    dup = sorted({n for n in seen if seen.count(n) > 1})
    missing = sorted(set(names) - set(seen))
    unknown = sorted(set(seen) - set(names))
    if dup or missing or unknown:
        raise ValueError(f"plan: every parameter must be in exactly one bucket (twice: {dup}, missing: {missing}, "
                         f"unknown: {unknown})")


def simulate(grads: list[Grad], plan, cost: Cost, backward_ms: float | None = None,
             forward_ms: float = 0.0, optimizer_ms: float = 0.0) -> Schedule:
    """Play one backward with its bucket all-reduces forward in time (see the module docstring).
    `backward_ms` is the compute-only backward (default: the last gradient's ready time)."""
    check_plan(plan, grads)
    by_name = {g.name: g for g in grads}
    last_ready = max(g.ready_ms for g in grads)
    work_total = last_ready if backward_ms is None else max(backward_ms, last_ready)
    # each bucket: the compute work after which it is launched (its last gradient is ready and every
    # bucket before it in the plan has been launched: DDP starts buckets in order), its index and bytes
    spec, launch_at = [], 0.0
    for j, b in enumerate(plan):
        launch_at = max(launch_at, max(by_name[n].ready_ms for n in b))
        spec.append((launch_at, j, sum(by_name[n].bytes for n in b)))
    slow = 1.0 / (1.0 + cost.interference)
    t = work = 0.0
    backward_end = 0.0 if work_total <= 0 else None
    nxt = 0                    # next bucket (in launch order) not yet launched
    queue = []                 # launched, not started: (launch time, spec entry)
    current = None             # [spec entry, launch, start, remaining work]
    done = []
    while True:
        while nxt < len(spec) and spec[nxt][0] <= work + _EPS:
            queue.append((t, spec[nxt]))
            nxt += 1
        if current is None and queue:
            launched, entry = queue.pop(0)
            current = [entry, launched, t, cost.allreduce_ms(entry[2])]
        if current is not None and current[3] <= _EPS:
            entry, launched, start, _ = current
            done.append(BucketTime(entry[1], tuple(plan[entry[1]]), entry[2], launched, start, t, cost.allreduce_ms(entry[2])))
            current = None
            continue
        computing = backward_end is None
        if not computing and current is None:
            break
        rate = slow if (computing and current is not None) else 1.0
        dt = current[3] / rate if current is not None else math.inf
        if computing:
            target = min(spec[nxt][0], work_total) if nxt < len(spec) else work_total
            dt = min(dt, max(target - work, 0.0) / rate)
        dt = max(dt, 0.0)
        t += dt
        if computing:
            work = min(work_total, work + rate * dt)
            if work >= work_total - _EPS:
                backward_end = t
        if current is not None:
            current[3] -= rate * dt
    if cost.link_hold is not None:   # the link's wire: one transfer at a time, in the order they finished
        free, held = -math.inf, []
        for b in sorted(done, key=lambda b: (b.finish_ms, b.index)):
            wire_ms = cost.link_hold.predict(b.bytes) * 1e3
            free = max(b.finish_ms, free) + wire_ms
            held.append(replace(b, finish_ms=free, cost_ms=b.cost_ms + wire_ms))
        done = held
    buckets = tuple(sorted(done, key=lambda b: b.index))
    return Schedule(buckets, backward_end, max((b.finish_ms for b in buckets), default=0.0), forward_ms, optimizer_ms)


def calibrate(predict_step_ms, measured_ms: float, lo: float = 0.0, hi: float = 20.0) -> float:
    """The value x in [lo, hi] with predict_step_ms(x) = measured_ms (predict must grow with x);
    bisection, clamped to the interval's ends."""
    if predict_step_ms(lo) >= measured_ms:
        return lo
    if predict_step_ms(hi) <= measured_ms:
        return hi
    for _ in range(60):
        mid = (lo + hi) / 2
        if predict_step_ms(mid) < measured_ms:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


KNOBS = ("interference", "comm_scale", "alpha_ms")


def with_knob(cost: Cost, knob: str, value: float) -> Cost:
    """`cost` with its `interference`, `comm_scale` or link alpha (`alpha_ms`) set to value."""
    if knob not in KNOBS:
        raise ValueError(f"knob: must be one of {', '.join(KNOBS)} (got {knob!r})")
    if knob == "alpha_ms":
        return replace(cost, link=replace(cost.link, alpha_s=value / 1e3))
    return replace(cost, **{knob: value})
