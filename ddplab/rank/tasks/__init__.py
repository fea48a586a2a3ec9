"""The tasks a rank can run, one module each: `train`, `allreduce_sweep`, `bucket_sweep`, `balance`,
`coverage`, `resume`, `fsdp_memory`, `tensor_parallel`, `pipeline`.

A task's spec section (`spec/tasks.py`) names its runner, `"ddplab.rank.tasks.<module>:run"`; the
worker calls it with a `TaskContext` and writes what it returns: the task's record (its part of
rank{r}.json, `record/`) and a dict of tensors for rank{r}.pt. Runs inside a rank.
Used by every notebook's runs.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path


@dataclass
class TaskContext:
    """Everything a task gets: the experiment, this rank, its device, its progress log and its
    process group (None: all ranks of the launch)."""

    exp: object
    rank: int
    device: object
    log: object
    group: object
    run_dir: Path


def runner(task):
    """The run function a task section names ("package.module:function")."""
    module, name = task.runner.split(":")
    return getattr(importlib.import_module(module), name)
