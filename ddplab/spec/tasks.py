"""What the ranks do: one spec section per task, each declaring its settings, its phases and its runner
(ddplab's own in `spec/<task>.py`, the task's record in `record/<task>.py`).

A task is declared once, here or in a module of your own, and runs unchanged through every stage:

    @register
    @dataclass(frozen=True, kw_only=True)
    class AllReduceSweep(TaskSpec):
        kind = "allreduce-sweep"                                  # its name in spec.json
        runner = "ddplab.rank.tasks.allreduce_sweep:run"           # called in every rank with a TaskContext
        record = AllReduceSweepRecord                              # its part of rank{r}.json (record/)
        phases = (Phase("all-reduce sweep", order=5, collective="all_reduce"),)
        reads = frozenset({"world_size", ...})                     # Experiment fields it uses
        sweep_bytes: tuple[int, ...] = ()                          # its own settings, validated in check()

- `phases` are what the rank logs as it goes (`rundir.ProgressLog`): the launcher's progress line and the
  hang diagnosis (`failures.py`) order the ranks by (step, micro, phase order) and name the collective a
  phase waits in. A rank in step s has finished s steps; entering a phase with `ends_step` finishes step
  s too (the progress counter). A phase with `deviation` is never part of a healthy run (an injected
  fault).
- `reads`: an Experiment field outside it that differs from its default is refused with a ValueError
  naming it, so no setting is silently ignored.
- A task declared outside ddplab is found again in every rank through the module named in spec.json:
  the rank worker imports it (it runs what the launcher wrote for you). Reading a spec never imports
  it: `from_dict` refuses a kind that is not registered yet, naming the module to import yourself.
Pure: no torch. Used by `Experiment` (spec/experiment.py), the launcher, the worker and `results`.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import ClassVar

from .checks import bad


@dataclass(frozen=True)
class Phase:
    name: str
    order: int                      # position inside one (step, micro-step): a rank further along has more
    collective: str | None = None   # the collective a rank in this phase waits in, if any
    ends_step: bool = False         # entering it means the step is done (the progress counter)
    deviation: bool = False         # not part of a healthy run (an injected fault)
    after_steps: bool = False       # comes after every step (teardown), whatever step it names


# every task's rank goes through these, around the task's own phases
COMMON_PHASES = (Phase("start", 0), Phase("init-process-group", 1, "rendezvous of all ranks"),
                 Phase("teardown", 90, after_steps=True), Phase("done", 91, after_steps=True))

_REGISTRY: dict[str, type] = {}


def register(cls):
    """Make a task known by its `kind` (a class decorator); ddplab's own register as `spec` is imported."""
    if not (isinstance(getattr(cls, "kind", None), str) and isinstance(getattr(cls, "runner", None), str)
            and re.fullmatch(r"[\w.]+:\w+", cls.runner)):
        raise ValueError(f"task {cls.__name__}: needs a `kind` and a `runner` 'package.module:function'")
    taken = _REGISTRY.get(cls.kind)
    if taken is not None and taken.__qualname__ != cls.__qualname__:
        raise ValueError(f"task kind {cls.kind!r} is already taken by {taken.__module__}.{taken.__qualname__}")
    _REGISTRY[cls.kind] = cls
    return cls


def kinds() -> list[str]:
    return sorted(_REGISTRY)


@dataclass(frozen=True, kw_only=True)
class TaskSpec:
    """The base of every task section (see the module docstring)."""

    kind: ClassVar[str]
    runner: ClassVar[str]
    record: ClassVar[type]
    phases: ClassVar[tuple[Phase, ...]]
    reads: ClassVar[frozenset[str] | None]   # None: every Experiment field
    step_unit: ClassVar[str] = "steps"
    # its ranks feed the examples a factory brings (a ModelWithData: images, labels); else the lab's tokens
    feeds_own_data: ClassVar[bool] = False

    def __post_init__(self):
        for f in dataclasses.fields(self):   # lists from a caller or from JSON: tuples, so the spec hashes
            if isinstance(getattr(self, f.name), list):
                object.__setattr__(self, f.name, tuple(getattr(self, f.name)))

    def check(self, exp) -> None:
        """Validate this section against the whole experiment; ValueError naming the field."""

    def total_steps(self, exp) -> int:
        """How many `ends_step` phases a rank goes through (the progress line's denominator)."""
        return exp.steps

    def mesh_dims(self, exp) -> tuple[tuple[str, int], ...] | None:
        """The named dimensions of the device mesh this task computes on, over the experiment's ranks
        (`(("dp", 2), ("tp", 2))`: 2 x 2, rows of consecutive ranks), or None for none. The worker builds it
        on every rank of the launch before any experiment runs (`rank/runtime.py: meshes`)."""
        return None

    def extra_groups(self, exp) -> tuple[tuple[tuple[int, ...], str | None], ...]:
        """The process groups the task uses besides its own, each (its ranks among 0..world_size-1, its
        backend; None: the launch's). The worker makes them on every rank of the launch before any
        experiment runs, in this order (`rank/runtime.py: extra_groups`): torch names a new group after
        how many groups each process made before, so a group that only some ranks make would shift the
        names of every later group on those ranks, and the next group of a session would never meet."""
        return ()

    def all_phases(self) -> dict[str, Phase]:
        return {p.name: p for p in (*COMMON_PHASES, *self.phases)}

    def to_dict(self) -> dict:
        d = {"kind": self.kind, **{k: list(v) if isinstance(v, tuple) else v
                                   for k, v in dataclasses.asdict(self).items()}}
        if not type(self).__module__.startswith("ddplab."):
            d["module"] = type(self).__module__
        return d

    @staticmethod
    def from_dict(d) -> "TaskSpec":
        if isinstance(d, TaskSpec):
            cls = type(d)
            if _REGISTRY.get(getattr(cls, "kind", None)) is not cls:
                bad("task", f"{cls.__name__} is not registered: decorate it with @register")
            if cls.__module__ == "__main__":
                bad("task", f"{cls.__name__} is defined in __main__ (a notebook or a script): every rank imports "
                            f"a task from its module, so define it in an importable module")
            return d
        if isinstance(d, str):
            d = {"kind": d}
        if not isinstance(d, dict) or "kind" not in d:
            bad("task", f"must be a task section such as Train() or AllReduceSweep(...) (got {d!r})")
        d = dict(d)
        kind, module = d.pop("kind"), d.pop("module", None)
        if isinstance(kind, str) and kind not in _REGISTRY and isinstance(module, str) and module:
            # never imported from here: a spec or a run directory would run code by naming a module
            bad("task", f"kind {kind!r} is declared in module {module!r}, which is not imported; ddplab never "
                        f"imports a module that a file names. If it is your own task, import it first "
                        f"(`import {module}`; on the command line: ddplab run --import {module} --spec ...)")
        if not isinstance(kind, str) or kind not in _REGISTRY:
            bad("task", f"must be one of {', '.join(kinds())} (got {kind!r})")
        cls = _REGISTRY[kind]
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            bad("task", f"{kind} has no setting(s) {', '.join(unknown)}")
        return cls(**d)


RUN_FIELDS = frozenset({"name", "task", "world_size", "backend", "device", "timeout_s", "pin_cpus"})
MODEL_FIELDS = frozenset({"model", "vocab_size", "d_model", "n_layers", "n_heads", "tie_weights", "checkpointing",
                          "seed", "dtype", "local_batch", "seq_len"})
GRADIENT_ALL_REDUCE = "DDP gradient all-reduce"
