"""The compiled-DDP comparison (`CompiledDdp`, notebook 11): the same model in DDP, eager and under
`torch.compile`, cap by cap.

Per cap, two arms from the same parameters: DDP eager, and `torch.compile(ddp, backend=...)` with
torch's default `optimize_ddp="ddp_optimizer"`, where Dynamo's DDPOptimizer splits the compiled graph
where it expects DDP's buckets to end. Both carry the lab's probes: the gradients' ready times
(post-accumulate-grad hooks, `rank/probes/readiness.py`) and DDP's own buckets as its Reducer all-reduces
them (a comm hook, `rank/probes/buckets.py`). What the lab does not re-derive, it reads from torch:
- the split: DDPOptimizer logs "used bucket cap ... and created N buckets" from `pretty_print_buckets`;
  a logging handler reads that call's `buckets` (their byte sizes and parameters) as torch made them;
- the graphs compiled: the backend is wrapped, and each graph it is handed is counted.
Each (cap, mode) is a block of its own, run under `torch._dynamo.config.patch(optimize_ddp=mode)`
(python_reducer also turns on compiled autograd), with Dynamo's caches reset before it (a new module of
the same class would otherwise reuse the graph, and the split, of the block before). Each block:
`warmup_steps` steps per arm (the first compiles;
each step's wall time kept), then `rounds` rounds of `steps_per_round` steps, eager and compiled
alternating which goes first, every step after an untimed barrier. Runs inside a rank.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import logging
import re

import torch
import torch.distributed as dist

from ...record.compiled_ddp import CompiledArm, CompiledDdpRecord, CompiledStep, SplitBucket
from ...spec.sharding import shard_ids
from ...tensors import rel_max_diff
from ...units import ms_after
from .. import clock, compiling, models
from ..parallel.ddp import wrap_in_ddp
from ..probes.buckets import BucketLog
from ..probes.readiness import ReadyLog
from ..training import flat_parameters, token_losses

SPLIT_LOGGER = "torch._dynamo.backends.distributed"


class SplitRecorder(logging.Handler):
    """Keeps DDPOptimizer's buckets each time it logs its split (torch's own record, read from the frame
    of `pretty_print_buckets` that logs it), as [(bytes, [dynamo parameter names], [parameter ids])]."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.splits: list[list[tuple[int, list[str], list[int]]]] = []
        self.empty = 0   # graphs DDPOptimizer saw without parameters (it says so at debug level)

    def emit(self, record):
        msg = record.getMessage()
        if "captured no parameters" in msg:
            self.empty += 1
        if "DDPOptimizer used bucket cap" not in msg:
            return
        frame = inspect.currentframe()
        while frame is not None and frame.f_code.co_name != "pretty_print_buckets":
            frame = frame.f_back
        buckets = frame.f_locals.get("buckets", []) if frame is not None else []
        self.splits.append([(int(b.size), list(b.params), list(b.param_ids)) for b in buckets])

    def __enter__(self):
        log, graphs = logging.getLogger(SPLIT_LOGGER), logging.getLogger(SPLIT_LOGGER + ".__ddp_graphs")
        self._saved = (log.level, log.propagate, list(log.handlers), graphs.level)
        for h in self._saved[2]:   # the record is kept here, not printed by every rank into its log
            log.removeHandler(h)
        log.setLevel(logging.DEBUG)
        log.propagate = False
        graphs.setLevel(logging.WARNING)   # DEBUG above would dump every split graph
        log.addHandler(self)
        return self

    def __exit__(self, *exc):
        log, graphs = logging.getLogger(SPLIT_LOGGER), logging.getLogger(SPLIT_LOGGER + ".__ddp_graphs")
        log.removeHandler(self)
        level, propagate, handlers, graphs_level = self._saved
        for h in handlers:
            log.addHandler(h)
        log.setLevel(level)
        log.propagate = propagate
        graphs.setLevel(graphs_level)


def module_name(dynamo_name: str, known: set[str]) -> str:
    """'L_self_modules_h_modules_0_modules_ln_1_parameters_weight_' -> 'h.0.ln_1.weight' (kept as it is
    when that is not one of the module's parameter names)."""
    parts = [p for p in re.split(r"(?:^|_)(?:modules|parameters)_", re.sub(r"^L_self_", "", dynamo_name)) if p]
    name = ".".join(parts).rstrip("_")
    return name if name in known else dynamo_name


@contextlib.contextmanager
def python_reducer_undone():
    """Undo, on exit, what building a DDP under `optimize_ddp="python_reducer"` changes for the whole process
    (torch 2.13's DDP constructor): Inductor's DDP-communication fusion and its bucket size, and Dynamo's
    inline list, which then traces into torch.nn.parallel.distributed. `torch._dynamo.reset()` undoes
    neither, so without this a later block of the same launch would run under them."""
    import torch._dynamo.trace_rules as rules
    import torch._inductor.config as inductor

    saved = (inductor._fuse_ddp_communication, inductor._fuse_ddp_bucket_size, set(rules.LEGACY_MOD_INLINELIST))
    try:
        yield
    finally:
        inductor._fuse_ddp_communication, inductor._fuse_ddp_bucket_size = saved[:2]
        rules.LEGACY_MOD_INLINELIST.clear()
        rules.LEGACY_MOD_INLINELIST.update(saved[2])
        rules.get_legacy_mod_inlinelist.cache_clear()


class _Arm:
    def __init__(self, ctx, base, cap, compiled: bool, mode: str = "ddp_optimizer"):
        self.cap, self.compiled, self.mode = cap, compiled, mode
        self.name = (f"{'compiled' if compiled else 'eager'}:{'default' if cap is None else f'{cap:g}'}"
                     + ("" if mode == "ddp_optimizer" else f"/{mode}"))
        self.config = dict(optimize_ddp=mode if compiled else "ddp_optimizer")
        self.compiled_autograd = compiled and mode == "python_reducer"
        self.module = copy.deepcopy(base)
        self.names = {id(p): n for n, p in self.module.named_parameters()}
        # compiled autograd traces Python hooks: the readiness probe's would cut its backward into a graph
        # per parameter (measured: 54 graphs, a first step of 54 s on 2 cores), so the Python reducer goes unprobed
        self.ready = None if compiled and mode == "python_reducer" else ReadyLog(self.module)
        with torch._dynamo.config.patch(**self.config):   # DDP reads the mode at construction (python_reducer)
            self.ddp = wrap_in_ddp(self.module, ctx.device, ctx.group, bucket_cap_mb=cap)
        self.buckets = BucketLog(ctx.group, self.names)
        if not (compiled and mode == "python_reducer"):
            # the Python reducer calls a comm hook once per gradient, with (grad, param): no bucket at all
            self.ddp.register_comm_hook(None, self.buckets.hook)
        self.graphs = 0
        backend = torch._dynamo.lookup_backend(ctx.exp.task.backend) if compiled else None

        def counting(gm, example_inputs):   # every graph the backend is handed: one per piece of the split
            self.graphs += 1
            return backend(gm, example_inputs)

        self.run = torch.compile(self.ddp, backend=counting) if compiled else self.ddp
        self.counting = counting
        self.optimizer = torch.optim.SGD(self.module.parameters(), lr=1e-3)
        self.first_steps_s: list[float] = []
        self.steps: list[CompiledStep] = []
        self.last_ready, self.last_backward_ns, self.last_buckets, self.last_launches = [], 0, [], []

    def step(self, x, y, group, round_: int | None = None) -> None:
        dist.barrier(group=group)
        with torch._dynamo.config.patch(**self.config):   # this arm's mode, for its forward and its backward
            t0 = clock.now_ns()
            loss = token_losses(self.run(x), y).mean()
            t1 = clock.now_ns()
            if self.ready:
                self.ready.active = True
            if self.compiled_autograd:   # the backward, and the Python reducer's all-reduces, compiled too
                with torch._dynamo.compiled_autograd._enable(torch.compile(backend=self.counting)):
                    loss.backward()
            else:
                loss.backward()
            t2 = clock.now_ns()
        if self.ready:
            self.ready.active = False
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        t3 = clock.now_ns()
        self.last_ready, self.last_backward_ns = (self.ready.take() if self.ready else []), t1
        launched = self.buckets.take()
        self.last_buckets, self.last_launches = [b.params for b in launched], [b.launch_ns for b in launched]
        if round_ is None:
            self.first_steps_s.append((t3 - t0) / 1e9)
        else:
            self.steps.append(CompiledStep(round_, ms_after(t3, t0), ms_after(t2, t1)))


def run(ctx):
    """Run the comparison on this rank; return (CompiledDdpRecord, no tensors)."""
    exp, task, group, log = ctx.exp, ctx.exp.task, ctx.group, ctx.log
    built = models.build_with_data(exp)
    base = built.module.to(device=ctx.device)
    known = {n for n, _ in base.named_parameters()}
    rank = dist.get_rank(group)
    x, y = (t.to(ctx.device) for t in built.batch(shard_ids(exp.local_batches, 1, 0, 0, rank), exp.seq_len_of(rank)))
    arms = []
    blocks = [(cap, mode) for cap in task.caps_mb for mode in task.modes]
    for i, (cap, mode) in enumerate(blocks):
        torch._dynamo.reset()   # a fresh cache: this block's DDP gets its own graph and its own split
        compiling.again()       # reset() cleared the callbacks that mark compiles as progress
        log.enter("construct", micro=i, detail=f"cap {cap}, {mode}")
        with contextlib.ExitStack() as block:
            if mode == "python_reducer":
                block.enter_context(python_reducer_undone())
            eager, compiled = _Arm(ctx, base, cap, False, mode), _Arm(ctx, base, cap, True, mode)
            recorder = block.enter_context(SplitRecorder())
            log.enter("warm-up", micro=i, detail=f"cap {cap}, {mode}")
            for _ in range(task.warmup_steps):
                for a in (eager, compiled):
                    a.step(x, y, group)
            for r in range(task.rounds):
                for s in range(task.steps_per_round):
                    log.enter("round", r, s + task.steps_per_round * i)
                    for a in ((eager, compiled) if (r * task.steps_per_round + s) % 2 == 0 else (compiled, eager)):
                        a.step(x, y, group, r)
        # the split of the last frame DDPOptimizer split (a recompile would record it again), in DDP's bucket
        # order; every recorded bucket counts toward the graphs the backend should have been handed
        last = recorder.splits[-1] if recorder.splits else []
        split = [SplitBucket(size, [module_name(name, known) for name in names]) for size, names, _ in reversed(last)]
        recorded = sum(len(s) for s in recorder.splits) + recorder.empty
        # the same steps on the same batches from the same start: the parameters must agree
        gap = rel_max_diff(flat_parameters(compiled.module), flat_parameters(eager.module))
        for a in (eager, compiled):
            arms.append(CompiledArm(a.name, cap, a.compiled, a.first_steps_s, a.graphs, split if a.compiled else None,
                                    recorded if a.compiled else 0, a.last_buckets, a.last_ready,
                                    a.last_backward_ns, a.steps, mode, gap if a.compiled else None, a.last_launches))
    sizes = {n: p.numel() * p.element_size() for n, p in base.named_parameters()}
    return CompiledDdpRecord(task.backend, sizes, arms), {}
