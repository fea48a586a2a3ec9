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
its report at most `timeout_s` and then name it.
"""

from __future__ import annotations

import hashlib
import json
import sys
from array import array
from datetime import timedelta

import torch
import torch.distributed as dist

from . import checks
from .fingerprint import batch_fingerprint, loss_reduction, tensor_fingerprint

_guards_made = 0


class GuardError(RuntimeError):
    """What the guard found at one check; `problems` holds each, `str()` says all of them."""

    def __init__(self, problems: list[checks.Problem]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


def _store(n: int):
    from torch.distributed.distributed_c10d import _get_default_store

    return dist.PrefixStore(f"ddplab-guard/{n}/", _get_default_store())


def _refuse(model, optimizer, sampler, every, on_problem, timeout_s) -> None:
    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"model: expected the DDP-wrapped nn.Module the loop trains, got {type(model).__name__}")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise ValueError(f"optimizer: expected a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if sampler is not None and not hasattr(type(sampler), "__iter__"):
        raise ValueError(f"sampler: expected a torch.utils.data.Sampler, got {type(sampler).__name__}")
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"every: expected a whole number of optimizer steps, at least 1, got {every!r}")
    if on_problem not in ("raise", "warn"):
        raise ValueError(f"on_problem: expected 'raise' or 'warn', got {on_problem!r}")
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
        raise ValueError(f"timeout_s: expected a positive number of seconds, got {timeout_s!r}")
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
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.store = _store(_guards_made)
        _guards_made += 1
        self.inner, self._adopted = inner, optimizer is not None
        self._track(optimizer)
        self.step = 0   # optimizer steps taken
        self.checks = 0
        self.problems: list[checks.Problem] = []
        self._said: set[str] = set()
        self._sampler_events: list[dict] = []
        self._last_order: str | None = None
        self._passes = 0
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

            mine = {id(p) for p in self.params}
            ours = lambda opt: any(id(p) in mine for g in opt.param_groups for p in g["params"])   # noqa: E731
            self._handles += [
                register_optimizer_step_pre_hook(lambda opt, a, k: self._before_step(opt, a, k) if ours(opt) else None),
                register_optimizer_step_post_hook(lambda opt, a, k: self._after_step(opt, a, k) if ours(opt) else None)]
        if sampler is not None:
            self._watch(sampler)

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
        self.static = {"params": names, "outside": [id(p) not in named for p in self.params],
                       "buffers": [n for n, _ in self.buffers],
                       "buffer_owners": [owners.get(id(b), "?") for _, b in self.buffers], "ddp": self.ddp}
        layout = [(n, tuple(p.shape)) for n, p in zip(names, self.params)] + [(n, tuple(b.shape)) for n, b in self.buffers]
        self.layout = hashlib.sha1(repr(layout).encode()).hexdigest()

    # ---- what the hooks record ---------------------------------------------------------------------------
    def due(self) -> bool:
        """Is the coming optimizer step one the guard checks?"""
        return self.step % self.every == 0

    def _fresh(self) -> None:
        self._batches, self._buffers, self._grads, self._loss, self._no_sync = [], None, None, None, False

    def _training(self) -> bool:
        """A forward that trains (the module in train mode, autograd on): a validation pass between steps
        (under no_grad, or in eval mode) reads the same data on every rank by design, and is no step's batch."""
        return self.model.training and torch.is_grad_enabled()

    def _on_forward(self, module, args, kwargs):
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
        if not self._adopted:   # attached without an optimizer: the first one stepping these parameters
            self._adopted = True
            self._track(optimizer)
        if self.due():
            self._grads = [None if p.grad is None else tensor_fingerprint(p.grad) for p in self.params]

    def _after_step(self, optimizer, args, kwargs):
        try:
            if self.due():
                self._check()
        finally:
            self.step += 1
            self._fresh()

    def _watch(self, sampler) -> None:
        """Record each epoch's order as the sampler hands it out (a subclass of its own class, so
        `isinstance` and every attribute stay as they were). Watching it again moves it to this guard."""
        sampler._ddplab_guard = self
        cls = type(sampler)
        if getattr(cls, "_ddplab_watched", False):
            return

        def __iter__(s):
            order = list(cls.__iter__(s))
            s._ddplab_guard._new_epoch(s, order)
            return iter(order)

        sampler.__class__ = type(cls.__name__, (cls,), {"__iter__": __iter__, "__module__": cls.__module__,
                                                        "__qualname__": cls.__qualname__, "_ddplab_watched": True})

    def _new_epoch(self, sampler, order: list) -> None:
        digest = hashlib.sha1(array("q", [int(i) for i in order]).tobytes()).hexdigest()
        first = self._last_order is None
        event = {"epoch": getattr(sampler, "epoch", None), "pass": self._passes, "n": len(order), "first": first,
                 "repeats": (not first and digest == self._last_order and len(order) > 1
                             and bool(getattr(sampler, "shuffle", True))), "padded": 0, "dropped": 0}
        if first and hasattr(sampler, "total_size") and hasattr(sampler, "dataset"):
            size = len(sampler.dataset)
            event["padded" if sampler.total_size >= size else "dropped"] = abs(sampler.total_size - size)
        self._last_order = digest
        self._passes += 1
        self._sampler_events.append(event)

    # ---- the check -------------------------------------------------------------------------------------
    def report(self) -> dict:
        """This rank's report for the step just taken (`checks.py` lists its fields)."""
        events, self._sampler_events = self._sampler_events, []
        return {"rank": self.rank, "step": self.step, "layout": self.layout, "batches": self._batches,
                "grads": self._grads, "params": [tensor_fingerprint(p) for p in self.params],
                "buffers": self._buffers, "no_sync": self._no_sync, "loss": self._loss, "sampler": events}

    def _check(self) -> None:
        reports = self._exchange(self.report())
        found = checks.find_problems(reports, self.static)
        self.problems += found
        errors = [p for p in found if p.severity == checks.ERROR]
        if errors and self.on_problem == "raise":
            raise GuardError(errors)
        for p in found:
            if p.kind not in self._said and self.rank == min(p.ranks or (0,)):
                print(str(p), file=sys.stderr, flush=True)
            self._said.add(p.kind)

    def _exchange(self, report: dict) -> list[dict]:
        """Every rank's report for this check, through the store; a rank missing after `timeout_s` is named."""
        n = self.checks
        keys = [f"{n}/{r}" for r in range(self.world_size)]
        self.store.set(keys[self.rank], json.dumps(report))
        try:
            self.store.wait(keys, timedelta(seconds=self.timeout_s))
        except (RuntimeError, dist.DistStoreError):
            missing = [r for r, k in enumerate(keys) if not self.store.check([k])]
            self.problems.append(checks.Problem(
                "rank-missing", self.step, tuple(missing),
                f"{checks._ranks(missing)} did not reach the guard's check within {self.timeout_s:g} s while "
                f"{checks._ranks([r for r in range(self.world_size) if r not in missing])} waited: "
                f"{'it' if len(missing) == 1 else 'they'} stopped taking optimizer steps (left the loop early, "
                "fewer batches than the others, or stuck in its own code)"))
            raise GuardError(self.problems[-1:]) from None
        reports = [json.loads(self.store.get(k)) for k in keys]
        if n:
            self.store.delete_key(f"{n - 1}/{self.rank}")   # every rank has read it: they all posted check n
        self.checks += 1
        return reports

    def close(self) -> None:
        """Remove every hook (the sampler keeps its subclass, which only records)."""
        for h in self._handles:
            h.remove()
        self._handles = []
