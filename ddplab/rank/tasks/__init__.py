"""The tasks a rank can run, one module each: `train`, `allreduce_sweep`, `bucket_sweep`, `balance`,
`coverage`, `resume`, `fsdp_memory`, `tensor_parallel`, `pipeline`.

A task's spec section (`spec/tasks.py`) names its runner, `"ddplab.rank.tasks.<module>:run"`; the
worker calls it with a `TaskContext` and writes what it returns: the task's record (its part of
rank{r}.json, `record/`) and a dict of tensors for rank{r}.pt. Runs inside a rank.
Used by every notebook's runs.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class TaskContext:
    """Everything a task gets: the experiment, this rank, its device, its progress log, its
    process group (None: all ranks of the launch), the device mesh its task asked for (`mesh_dims`) and
    the other groups it asked for (`extra_groups`, in its order)."""

    exp: object
    rank: int
    device: object
    log: object
    group: object
    run_dir: Path
    mesh: object = None
    extra_groups: list = field(default_factory=list)


def runner(task):
    """The run function a task section names ("package.module:function")."""
    module, name = task.runner.split(":")
    return getattr(importlib.import_module(module), name)


def task_module(spec: dict) -> str | None:
    """The module where a spec's own task is declared (`task.module`), if it names one."""
    task = spec.get("task")
    module = task.get("module") if isinstance(task, dict) else None
    return module if isinstance(module, str) and module else None


def import_task_modules(spec_texts: list[str]) -> None:
    """Import the modules of the specs' own tasks, in order, once each: the rank runs what the launcher
    wrote for this launch (which had those modules imported), so the specs can be read; reading a spec
    never imports them."""
    for name in dict.fromkeys(filter(None, (task_module(json.loads(t)) for t in spec_texts))):
        importlib.import_module(name)
