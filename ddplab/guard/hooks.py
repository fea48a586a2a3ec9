"""`Guard`: hooks on a practitioner's own DDP model, optimizer and sampler that check, every `every`
optimizer steps, what data parallelism silently assumes (`checks.py` says what each check concludes).

It hooks what the training loop already calls, so the loop itself stays as it is:
- a forward pre-hook on the DDP model: each forward's inputs (one fingerprint per forward) and whether
  DDP's gradient synchronization was on (`no_sync`);
- a forward pre-hook on the module inside DDP: its buffers as the forward sees them, after DDP has
  broadcast rank 0's (so DDP's default, broadcast_buffers=True, never looks like drift);
- a forward hook: a Hugging Face model's `output.loss`, if it has one;
- the optimizer's step pre-hook (the gradients as the step will use them) and post-hook (the parameters
  it made, then the exchange and the verdict);
- the sampler's `__iter__` (each epoch's order), if one is given.

The ranks exchange their reports through the process group's store (the rendezvous key-value store),
never through a collective: a rank that stops calling the guard cannot hang the others, which wait for
its report at most `timeout_s` and then name it. A rank that stops between steps leaves the others inside
a collective, where no hook runs: there a thread per rank (`watcher.py`) names it after `timeout_s`.
"""

from __future__ import annotations

import hashlib
import math
import sys
import time

import torch
import torch.distributed as dist

from . import checks
from .exchange import Exchange, RankMissing
from .fingerprint import batch_fingerprint, loss_reduction, tensor_fingerprint
from .sampler import watch
from .watcher import Watcher

_guards_made = 0


class GuardError(RuntimeError):
    """What the guard found at one check; `problems` holds each, `str()` says all of them."""

    def __init__(self, problems: list[checks.Problem]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


def _refuse(model, optimizer, sampler, every, on_problem, timeout_s) -> None:
    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"model: expected the DDP-wrapped nn.Module the loop trains, got {type(model).__name__}")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise ValueError(f"optimizer: expected a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if sampler is not None and not isinstance(sampler, torch.utils.data.Sampler):
        raise ValueError(f"sampler: expected a torch.utils.data.Sampler, got {type(sampler).__name__}")
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"every: expected a whole number of optimizer steps, at least 1, got {every!r}")
    if on_problem not in ("raise", "warn"):
        raise ValueError(f"on_problem: expected 'raise' or 'warn', got {on_problem!r}")
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 < timeout_s < math.inf:
        raise ValueError(f"timeout_s: expected a positive, finite number of seconds, got {timeout_s!r}")
    if type(model).__name__ == "FullyShardedDataParallel" or any(
            type(p).__name__ == "DTensor" for p in model.parameters()):
        raise ValueError("model: the guard checks data-parallel replicas (DDP, or a plain module); this model's "
                         "parameters are sharded (FSDP or DTensor), so the ranks hold different parts by design")
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("model: torch.distributed has no process group yet: call dist.init_process_group() "
                         "(under torchrun) before ddplab.guard.attach")


class Guard:
    """See the package's docstring; `attach(model, optimizer, ...)` makes one."""

    def __init__(self, model, optimizer=None, *, sampler=None, every: int = 10, on_problem: str = "raise",
                 timeout_s: float = 300.0):
        global _guards_made
        _refuse(model, optimizer, sampler, every, on_problem, timeout_s)
        from torch.nn.parallel import DistributedDataParallel

        self.model, self.every, self.on_problem, self.timeout_s = model, every, on_problem, float(timeout_s)
        self.ddp = isinstance(model, DistributedDataParallel)
        inner = model.module if self.ddp else model
        group = getattr(model, "process_group", None) if self.ddp else None
        self.group_ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
        self.rank = dist.get_rank()
        self.exchange = Exchange(self.group_ranks, _guards_made, timeout_s)
        _guards_made += 1
        self.stopped = False   # after a check some rank never reached, in warn mode
        self.inner, self._optimizer = inner, optimizer
        self._track(optimizer)
        self.step = 0   # optimizer steps taken
        self.forwards, self._backward_of = 0, -1   # training forwards in this step; the one whose backward began
        self._moved_at = time.monotonic()
        self.problems: list[checks.Problem] = []
        self._said: set[str] = set()
        self._raised = False   # the watcher's verdict, raised once on this rank
        self.sampler_events: list[dict] = []   # filled by sampler.watch
        self._fresh()
        self._handles = [
            model.register_forward_pre_hook(self._on_forward, with_kwargs=True),
            inner.register_forward_pre_hook(self._on_inner_forward),
            model.register_forward_hook(self._on_output),
        ]
        if optimizer is not None:
            self._handles += [optimizer.register_step_pre_hook(self._before_step),
                              optimizer.register_step_post_hook(self._after_step)]
        else:   # every optimizer that updates these parameters
            from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

            mine, depth = {id(p) for p in self.params}, [0]

            def ours(opt) -> bool:   # the first optimizer stepping these parameters, and only its outermost step
                if self._optimizer is not None:
                    return opt is self._optimizer
                return any(id(p) in mine for g in opt.param_groups for p in g["params"])

            def pre(opt, args, kwargs):
                depth[0] += 1   # ZeroRedundancyOptimizer steps an inner optimizer inside its own step
                if depth[0] == 1 and ours(opt):
                    self._before_step(opt, args, kwargs)

            def post(opt, args, kwargs):
                depth[0] -= 1
                if depth[0] == 0 and ours(opt):
                    self._after_step(opt, args, kwargs)

            self._handles += [register_optimizer_step_pre_hook(pre), register_optimizer_step_post_hook(post)]
        trained = [p for p in inner.parameters() if p.requires_grad]
        for p in {id(p): p for p in trained[:1] + trained[-1:]}.values():   # both ends of the backward pass
            self._handles.append(p.register_post_accumulate_grad_hook(self._on_backward))
        if sampler is not None:
            watch(sampler, self)
        self.watcher = Watcher(self, self.exchange.store, self.group_ranks, self.exchange.index, self.timeout_s)

    def _track(self, optimizer) -> None:
        """The tensors a report covers: the optimizer's parameters (those outside the model named by
        their place in it), or the model's trainable ones; and the model's buffers."""
        inner = self.inner
        named = {id(p): n for n, p in inner.named_parameters()}
        if optimizer is not None:
            self.params = [p for group in optimizer.param_groups for p in group["params"]]
            names = [named.get(id(p), f"optimizer.param_groups[{g}] #{i} {tuple(p.shape)}")
                     for g, group in enumerate(optimizer.param_groups) for i, p in enumerate(group["params"])]
        else:
            trained = [(n, p) for n, p in inner.named_parameters() if p.requires_grad]
            names, self.params = [n for n, _ in trained], [p for _, p in trained]
        owners = {id(b): type(m).__name__ for m in inner.modules() for b in m.buffers(recurse=False)}
        self.buffers = [(n, b) for n, b in inner.named_buffers()]
        self.static = {"params": names, "buffers": [n for n, _ in self.buffers],
                       "buffer_owners": [owners.get(id(b), "?") for _, b in self.buffers], "ddp": self.ddp}
        self._held()
        layout = [(n, tuple(p.shape)) for n, p in zip(names, self.params)] + [(n, tuple(b.shape)) for n, b in self.buffers]
        self.layout = hashlib.sha1(repr(layout).encode()).hexdigest()

    def _held(self) -> None:
        """Which tracked parameters DDP does not reduce (`outside`), and which of those the module gained after
        DDP wrapped it (`late`), read from the running DDP object at each check: DDP builds its buckets from
        the module's parameters once, in its constructor (`_module_parameters`, less `parameters_to_ignore`),
        so a parameter registered later is the module's but never reduced."""
        named = {id(p): n for n, p in self.inner.named_parameters()}
        ignored = set(getattr(self.model, "parameters_to_ignore", ()) or ())   # DDP(..)'s own ignore list
        record = getattr(self.model, "_module_parameters", None) if self.ddp else None
        held = None if record is None else {id(p) for p in record}
        outside, late = [], []
        for p in self.params:
            mine = id(p) in named and named[id(p)] not in ignored
            outside.append(not mine or (held is not None and id(p) not in held))
            late.append(mine and held is not None and id(p) not in held)
        self.static.update(outside=outside, late=late)

    # ---- what the hooks record ---------------------------------------------------------------------------
    def due(self) -> bool:
        """Is the coming optimizer step one the guard checks?"""
        return not self.stopped and self.step % self.every == 0

    def _fresh(self) -> None:
        self._batches, self._buffers, self._grads, self._loss, self._no_sync = [], None, None, None, False

    def _training(self) -> bool:
        """A forward that trains (the module in train mode, autograd on): a validation pass between steps
        (under no_grad, or in eval mode) reads the same data on every rank by design, and is no step's batch."""
        return self.model.training and torch.is_grad_enabled()

    @property
    def position(self) -> tuple[int, int, int]:
        """Where this rank's loop is: (optimizer steps taken, training forwards of this step, 1 once backward
        of the last of them has begun), which `watcher.py` compares across ranks."""
        return self.step, self.forwards, int(self.forwards > 0 and self._backward_of == self.forwards)

    def _moved(self) -> None:
        """After a pause of timeout_s, the watcher may have named this rank: raise it here, in the loop."""
        now = time.monotonic()
        paused, self._moved_at = now - self._moved_at >= self.timeout_s, now
        problem = self.watcher.verdict() if paused or self.watcher.problem else None
        if problem is not None and self.on_problem == "raise" and not self._raised:
            self._raised = True
            raise GuardError([problem])

    def _on_backward(self, param) -> None:
        self._backward_of = self.forwards

    def _on_forward(self, module, args, kwargs):
        if self._training():
            self._moved()
            self.forwards += 1
        if self.due() and self._training():
            fp = batch_fingerprint(args, kwargs)
            if fp is not None:
                self._batches.append(fp)
            self._no_sync = self.ddp and not getattr(module, "require_backward_grad_sync", True)

    def _on_inner_forward(self, module, args):
        if self.due() and self._buffers is None and self._training():
            self._buffers = [tensor_fingerprint(b) for _, b in self.buffers]

    def _on_output(self, module, args, output):
        loss = getattr(output, "loss", None)
        if self.due() and isinstance(loss, torch.Tensor) and loss.dim() == 0 and loss.requires_grad:
            self.loss(loss)

    def loss(self, loss: torch.Tensor, count: float | None = None) -> None:
        """Tell the guard the loss this rank will call backward on, so it can judge how the ranks weigh
        their examples. `count`: how many examples (or tokens) the loss averages over, where its autograd
        graph cannot say (a hand-written mean)."""
        if not self.due():
            return
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise ValueError(f"loss: expected the scalar loss tensor, got {type(loss).__name__}")
        reduction, denominator, scale = loss_reduction(loss)
        if count is not None:
            denominator = float(count)
        self._loss = {"value": float(loss.detach()), "reduction": reduction, "denominator": denominator,
                      "scale": scale}

    def _before_step(self, optimizer, args, kwargs):
        self._moved()
        if self._optimizer is None:   # attached without an optimizer: the first one stepping these parameters
            self._optimizer = optimizer
            self._track(optimizer)
        if self.due():
            self._grads = [None if p.grad is None else tensor_fingerprint(p.grad) for p in self.params]

    def _after_step(self, optimizer, args, kwargs):
        try:
            if self.due():
                self._check()
        finally:
            self.step, self.forwards, self._backward_of = self.step + 1, 0, -1
            self._fresh()

    # ---- the check -------------------------------------------------------------------------------------
    def report(self) -> dict:
        """This rank's report for the step just taken (`checks.py` lists its fields)."""
        events, self.sampler_events = self.sampler_events, []
        return {"rank": self.rank, "step": self.step, "layout": self.layout, "batches": self._batches,
                "grads": self._grads, "params": [tensor_fingerprint(p) for p in self.params],
                "buffers": self._buffers, "no_sync": self._no_sync, "loss": self._loss, "sampler": events}

    def _check(self) -> None:
        try:
            reports = self.exchange.swap(self.report(), self.step)
        except RankMissing as missing:
            self.problems.append(missing.problem)
            if self.on_problem == "raise":
                raise GuardError([missing.problem]) from None
            self.stopped = True   # the ranks no longer step together: no later check could be matched
            print(f"{missing.problem} The guard stops checking.", file=sys.stderr, flush=True)
            return
        self._held()
        found = checks.find_problems(reports, self.static)
        self.problems += found
        errors = [p for p in found if p.severity == checks.ERROR]
        if errors and self.on_problem == "raise":
            raise GuardError(errors)
        for p in found:
            if p.kind not in self._said and self.rank == min(p.ranks or (self.rank,)):
                print(str(p), file=sys.stderr, flush=True)
            self._said.add(p.kind)

    def close(self) -> None:
        """Remove every hook (a watched sampler keeps its subclass, which only records)."""
        for h in self._handles:
            h.remove()
        self._handles = []
        self.watcher.close()
