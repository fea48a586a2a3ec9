"""The silent DDP bugs, caught in your own torchrun training script: two lines.

    import ddplab.guard

    model = DDP(net)
    optimizer = torch.optim.AdamW(model.parameters())
    guard = ddplab.guard.attach(model, optimizer, sampler=train_sampler)   # every=10, on_problem="raise"
    for epoch in ...:
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            guard.loss(loss)        # optional: lets it judge how the ranks weigh their examples
            loss.backward()
            optimizer.step()

Every `every` optimizer steps, each rank fingerprints what the step used and made, the ranks compare
fingerprints (through the rendezvous store, never a collective), and every rank raises the same
`GuardError` naming the step, the ranks and the fix:
- the same batch on two ranks (the data is not sharded);
- gradients that differ before the step (`no_sync` left on; a parameter the optimizer updates but DDP
  does not hold; a model not wrapped in DDP);
- replicas that differ after the step, and buffers (BatchNorm's running statistics) that differ as the
  forward sees them (`broadcast_buffers=False` without SyncBatchNorm);
- examples weighed differently by rank: a per-rank mean loss under unequal local batches (or token
  counts), DDP then averaging the ranks;
- a sampler that repeats the previous epoch's order (`set_epoch` forgotten); and, as a note, the
  examples a DistributedSampler pads (read twice) or drops each epoch;
- gradients of a parameter registered on the model after DDP wrapped it (DDP never reduces it);
- a rank that stopped stepping, after `timeout_s`: at a check, the others name it when its report does
  not come; between checks (the others then wait inside DDP's collectives, where no hook runs), a thread
  per rank (`watcher.py`) names it. A rank blocked in a collective cannot raise: with on_problem="raise"
  it prints the verdict and ends its process (exit code 1), so torchrun stops the job; the rank that
  stopped raises the verdict if it comes back. What the watcher cannot tell apart: a rank that stops where
  the others wait too (inside backward, in a collective), a rank slow in every step but never still for
  `timeout_s`, and a hang of the whole group.

A Hugging Face model's `output.loss` is picked up without `guard.loss`. `on_problem="warn"` prints each
kind of problem once (from the lowest rank involved) and keeps training; `guard.problems` lists them all.
A rank that stopped stepping (under DDP's join(), the one that ran out of data) is named; in warn mode the
guard then stops checking. Only training forwards count (train mode, autograd on): a validation pass on
the same data on every rank is no step's batch. Examples weighed less than 5% apart (padding, ignored
targets) are a note, not an error.
Without an optimizer, the guard hooks every optimizer that updates the model's parameters. The cost is
bounded by `every` (`python bench/guard_overhead.py`).

`fingerprint.py`: exact tensor fingerprints and the loss's reduction; `checks.py`: the verdicts (pure);
`hooks.py`: what the hooks record (`Guard`); `exchange.py`: the reports through the store; `watcher.py`: the
thread that names a rank which stopped between checks; `sampler.py`:
each epoch's order; `__main__.py`: `torchrun ... -m ddplab.guard train.py`, a script left unchanged.
"""

from __future__ import annotations


def attach(model, optimizer=None, *, sampler=None, every: int = 10, on_problem: str = "raise",
           timeout_s: float = 300.0):
    """A `Guard` on `model` (DDP-wrapped, or a plain module whose gradients the loop averages itself),
    checked at every `every`-th step of `optimizer`; ValueError naming the argument if one cannot work.

    `timeout_s` bounds how long one rank may stand still while the others wait for it: a rank that works
    alone between steps for longer (`if rank == 0: evaluate()`, a long torch.save) is taken for a stopped
    one, and with on_problem="raise" the waiting ranks are ended. Raise `timeout_s` above that time."""
    from .hooks import Guard

    return Guard(model, optimizer, sampler=sampler, every=every, on_problem=on_problem, timeout_s=timeout_s)


def __getattr__(name):
    if name in ("Guard", "GuardError"):
        from . import hooks

        return getattr(hooks, name)
    raise AttributeError(f"module 'ddplab.guard' has no attribute {name!r}")
