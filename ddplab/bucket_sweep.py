"""The rank side of a bucket sweep (`task="bucket-sweep"`): many bucket plans, timed in one launch.

Every plan gets its own copy of the same model (same seed), its own wrapper and optimizer:
- "compute-only": no synchronization at all; its readiness trace (when each gradient became ready,
  with no communication competing) is what the simulator takes as backward's own timeline;
- "ddp:<cap>": torch DDP with that `bucket_cap_mb`, traced by the readiness and bucket probes;
- "bare:<cap>": torch DDP with its own C++ all-reduce and no probe (to price the probes);
- "plan:<cap>" / "split:<cap>": `BucketedSync` with DDP's bucketing rule applied to the measured
  ready order, as is or with the last bucket cut in two.
Each plan first takes 2 warm-up steps (DDP rebuilds its buckets after the first), then goes back to
the common starting parameters for one check step with its real buckets: the reduced gradients and
updated parameters of every synchronized plan are compared with the first plan's, and so are the
final parameters after the timed steps (every plan takes the same steps on the same batch). Then `repeats` rounds run every plan for `steps`
timed steps in a row, in alternating order, with the compute-only baseline at both ends of each round
(so drift on a shared machine hits every plan alike); every step starts with an untimed barrier, so
the ranks run in lock-step in every plan.
Per step the rank records forward, backward and optimizer time, and (probed plans) when each
gradient became ready and each bucket was launched and finished, in ms after backward started.
"""

from __future__ import annotations

import copy
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from . import data, models, schedule
from .bucketed_sync import BucketedSync
from .readiness import BucketLog, ReadyLog
from .spec import Experiment, parse_plan
from .training import DTYPES, flat_parameters, token_losses

WARMUP_STEPS = 2
MIB = 2 ** 20


class _Arm:
    """One plan's model, wrapper, optimizer and probes."""

    def __init__(self, name, module, wrapper, ready, buckets):
        self.name, self.module, self.wrapper, self.ready, self.buckets = name, module, wrapper, ready, buckets
        self.optimizer = torch.optim.SGD(module.parameters(), lr=1e-3)
        self.steps: list[dict] = []

    def step(self, x, y, device, group, before_optimizer=None) -> dict:
        sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
        # every plan, compute-only included, starts its step on all ranks together (untimed): ranks in
        # lock-step compete for memory bandwidth the same way in every plan
        dist.barrier(group=group)
        t0 = time.perf_counter_ns()
        loss = token_losses(self.wrapper(x), y).mean()
        sync()
        t1 = time.perf_counter_ns()
        if self.ready:
            self.ready.active = True
        loss.backward()
        sync()
        t2 = time.perf_counter_ns()
        if self.ready:
            self.ready.active = False
        if before_optimizer:
            before_optimizer()
            t2 = time.perf_counter_ns()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        sync()
        t3 = time.perf_counter_ns()
        entry = {"forward_ms": (t1 - t0) / 1e6, "backward_ms": (t2 - t1) / 1e6, "optimizer_ms": (t3 - t2) / 1e6,
                 "step_ms": (t3 - t0) / 1e6}
        if self.ready:
            entry["ready"] = [[n, (t - t1) / 1e6] for n, t in self.ready.take()]
        if self.buckets:
            entry["buckets"] = [{"index": b["index"], "bytes": b["bytes"], "params": b["params"],
                                 "launch_ms": (b["launch_ns"] - t1) / 1e6, "done_ms": (b["done_ns"] - t1) / 1e6}
                                for b in self.buckets.take()]
        return entry


def _flat_grads(module) -> torch.Tensor:
    """Every parameter's gradient as one float64 vector on the CPU (beside training.flat_parameters)."""
    return torch.cat([p.grad.detach().double().cpu().flatten() for p in module.parameters()])


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def run(exp: Experiment, env, device: torch.device, log, group=None):
    """Run the sweep on this rank; return (record, tensors) like worker.train."""
    base = models.build(exp).to(device=device, dtype=DTYPES[exp.dtype])
    x, y = (t.to(device) for t in data.batch(exp.seed, data.shard_ids(exp.local_batches, 1, 0, 0, env.rank),
                                             exp.seq_len_of(env.rank), exp.vocab_size))
    names = [n for n, _ in base.named_parameters()]
    sizes = {n: p.numel() * p.element_size() for n, p in base.named_parameters()}

    def arm(name):
        module = copy.deepcopy(base)
        kind, cap = ("compute", None) if name == "compute-only" else parse_plan(name)
        probed = kind != "bare"
        ready = ReadyLog(module) if probed else None
        if kind == "compute":
            return _Arm(name, module, module, ready, None)
        if kind in ("ddp", "bare"):
            log.enter("ddp-construct", collective="broadcast of rank 0's parameters")
            wrapper = DDP(module, device_ids=[device] if device.type == "cuda" else None, bucket_cap_mb=cap,
                          process_group=group)
            buckets = None
            if probed:
                buckets = BucketLog(group, {id(p): n for n, p in module.named_parameters()})
                wrapper.register_comm_hook(None, buckets.hook)
            return _Arm(name, module, wrapper, ready, buckets)
        plan = schedule.ddp_plan(grads, cap * MIB)
        if kind == "split":
            if len(plan[-1]) < 2:
                raise ValueError(f"Experiment.plans: {name!r}: at this cap the last bucket is one tensor "
                                 f"({plan[-1][0]}), so there is nothing to split; use a larger cap")
            plan = schedule.split_bucket(plan, grads)
        log.enter("bucketed-sync-construct", collective="broadcast of rank 0's parameters")
        wrapper = BucketedSync(module, plan, group)
        return _Arm(name, module, wrapper, ready, wrapper)

    # compute-only first: its warm-up gives the ready order that plan/split buckets follow (rank 0's, so
    # every rank builds the same buckets)
    arms = [arm("compute-only")]
    log.enter("warm-up compute-only")
    warm = [arms[0].step(x, y, device, group) for _ in range(WARMUP_STEPS)]
    shared = [warm[-1]["ready"]]
    dist.broadcast_object_list(shared, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
    grads = schedule.grads_in_ready_order([n for n, _ in shared[0]], [sizes[n] for n, _ in shared[0]],
                                          [t for _, t in shared[0]])
    copy_bytes_per_s = _copy_bandwidth(sum(sizes.values()), device, dtype=DTYPES[exp.dtype])
    checks, first = {}, None
    for name in exp.plans:
        a = arm(name)
        arms.append(a)
        log.enter(f"warm-up {name}", collective="gradient all-reduce")
        for _ in range(WARMUP_STEPS):   # DDP rebuilds its buckets at the start of the second step
            a.step(x, y, device, group)
        # the check step: back to the common starting parameters, then one step with the plan's real
        # buckets; keep its reduced gradient and its updated parameters
        with torch.no_grad():
            for p, q in zip(a.module.parameters(), base.parameters()):
                p.copy_(q)
        grads_of = {}
        a.step(x, y, device, group, before_optimizer=lambda: grads_of.setdefault("g", _flat_grads(a.module)))
        state = (grads_of["g"], flat_parameters(a.module))
        if first is None:
            first = state
        checks[name] = {"grad_rel_diff": _rel(state[0], first[0]), "param_rel_diff": _rel(state[1], first[1])}
        del grads_of, state

    # rounds of blocks: each plan runs `steps` steps in a row (its caches warm, as in training), the
    # order alternates from round to round, and the compute-only baseline runs at both ends of every
    # round (a shared machine drifts by tens of percent within seconds; the baseline must see it all)
    for r in range(exp.repeats):
        plans = arms[1:] if r % 2 == 0 else arms[:0:-1]
        for a in [arms[0], *plans, arms[0]]:
            log.enter(f"round {r} {a.name}", collective=None if a is arms[0] else "gradient all-reduce")
            for _ in range(exp.steps):
                a.steps.append({"round": r, **a.step(x, y, device, group)})

    # every synchronized plan took the same steps from the same state on the same batch: its final
    # parameters must match the first plan's (the mathematics is the same; only the schedule differs)
    final = flat_parameters(arms[1].module) if len(arms) > 1 else None
    for a in arms[1:]:
        checks[a.name]["final_param_rel_diff"] = _rel(flat_parameters(a.module), final)
    layout = {a.name: [b["params"] for b in a.steps[-1].get("buckets", [])] for a in arms}
    record = {"steps": [], "param_checksum": {}, "parameter_names": names, "parameter_bytes": sizes,
              "model": {"parameter_count": models.parameter_count(base),
                        "parameter_bytes": sum(sizes.values())},
              "bucket_sweep": {"warmup_steps": WARMUP_STEPS, "ready_order": shared[0],
                               "copy_bytes_per_s": copy_bytes_per_s,
                               "arms": [{"name": a.name, "layout": layout[a.name], "check": checks.get(a.name),
                                         "steps": [_strip(s) for s in a.steps]} for a in arms]}}
    return record, {}


def _copy_bandwidth(n_bytes: int, device, dtype, repeats: int = 9) -> float:
    """Bytes per second of one tensor copy the size of the whole gradient (what DDP pays to copy
    gradients into its buckets and back); the median of `repeats`."""
    src = torch.ones(n_bytes // torch.finfo(dtype).bits * 8, device=device, dtype=dtype)
    dst = torch.empty_like(src)
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter_ns()
        dst.copy_(src)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter_ns() - t0)
    return src.numel() * src.element_size() / (sorted(times)[repeats // 2] / 1e9)


def _strip(step: dict) -> dict:
    """Per timed step keep timings, ready times and bucket times; bucket membership is kept once per
    plan (its layout), not per step."""
    out = {k: v for k, v in step.items() if k != "buckets"}
    if "buckets" in step:
        out["buckets"] = [{k: v for k, v in b.items() if k != "params"} for b in step["buckets"]]
    return out
