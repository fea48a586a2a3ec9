"""A SLURM batch script for an experiment: `sbatch` gives it the nodes, `srun` starts one torchrun agent per node.

    ddplab slurm --world-size 16 --nodes 2 --gpus-per-node 8 --partition gpu --out /shared/runs/ddp16 > ddp16.sbatch
    sbatch ddp16.sbatch

The script is self-contained: the experiment's spec is written into it, and it runs `ddplab run` on
the allocation's first node with `DDPLAB_NODE_LAUNCHER=srun`. That launch starts `srun` over every
node, each running torchrun (`launch.torchrun.srun_argv`: `--nnodes`, a c10d rendezvous hosted on the
first node), and it keeps everything a launch on one machine has: the watchdog and the process-group
timeouts, the diagnosis naming the rank, every process stopped on failure, the cross-checked run
directory. That directory must be on a filesystem every node sees. `render` refuses bad settings
with a ValueError naming the field (nothing is written); the tests check the script with `bash -n`
and shellcheck, and run it end to end with stand-ins for `srun` and `scontrol` on this host.
Used by `ddplab slurm`.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

from ..spec import Experiment
from .nodes import DEFAULT_JOIN_TIMEOUT_S, Nodes
from .torchrun import WORKER, srun_argv

_TIME = re.compile(r"^(\d+-)?\d+(:\d{2}){0,2}$")   # SLURM's --time: M, M:SS, H:MM:SS, D-H[:MM[:SS]]
_NAME = re.compile(r"^[A-Za-z0-9_.,-]+$")               # partition, account: no spaces, no shell


def render(exp: Experiment, nodes: int, out, *, gpus_per_node: int = 0, cpus_per_rank: int = 2,
           time_limit: str = "00:30:00", partition: str | None = None, account: str | None = None,
           python: str | None = None) -> str:
    """The batch script that runs `exp` on `nodes` nodes into the run directory `out` (absolute once
    rendered: the nodes share the path)."""
    if not isinstance(exp, Experiment):
        raise TypeError(f"render() takes an Experiment, got {type(exp).__name__}")
    Nodes(nodes)   # the node count's own check
    for name, value, least in (("gpus_per_node", gpus_per_node, 0), ("cpus_per_rank", cpus_per_rank, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{name}: must be a whole number of at least {least}, got {value!r}")
    if not _TIME.match(str(time_limit)):
        raise ValueError(f"time_limit: SLURM's --time is MM, MM:SS, HH:MM:SS or D-HH:MM:SS, got {time_limit!r}")
    for name, value in (("partition", partition), ("account", account)):
        if value is not None and not _NAME.match(str(value)):
            raise ValueError(f"{name}: letters, digits and _.,- only, got {value!r}")
    layout = Nodes(nodes, "srun")
    per_node = layout.per_node(exp.world_size)
    cpus = per_node * cpus_per_rank   # one task per node: all its ranks' cores
    if exp.backend == "nccl" and per_node > gpus_per_node:
        raise ValueError(f"gpus_per_node: NCCL needs one GPU per rank, and {exp.world_size} ranks on {nodes} nodes "
                         f"are {per_node} per node; ask for --gpus-per-node {per_node} or more")
    if exp.device == "cuda" and gpus_per_node == 0:
        raise ValueError("gpus_per_node: the experiment asks for device='cuda'; ask for GPUs per node")
    run_dir = Path(out).resolve()
    python = python or sys.executable
    shown = srun_argv(nodes, per_node, ["-m", WORKER, "--spec", "<run dir>/spec.json"], python, "$HEAD:$PORT",
                      "ddplab-<launch>")
    sbatch = {"job-name": f"ddplab-{exp.name}"[:64], "nodes": nodes, "ntasks-per-node": 1,
              "cpus-per-task": cpus, "gpus-per-node": gpus_per_node or None,
              "time": time_limit, "partition": partition, "account": account,
              "output": f"ddplab-{exp.name}-%j.out"}   # in the directory sbatch was run from
    spec = exp.to_json()
    module = exp.task.to_dict().get("module")   # a task of your own: `ddplab run` imports it only when told
    imports = f" --import {shlex.quote(module)}" if module else ""
    if "\nDDPLAB_SPEC\n" in f"\n{spec}\n":
        raise ValueError("Experiment: its JSON contains the heredoc's end marker")
    lines = ["#!/bin/bash",
             *(f"#SBATCH --{k}={v}" for k, v in sbatch.items() if v is not None),
             f"# ddplab: experiment {exp.name}-{exp.hash}, {layout.describe(exp.world_size)}.",
             "# Submit with `sbatch <this file>`. The run directory below must be on a filesystem every node sees,",
             "# and this Python (with ddplab and torch installed) must exist at the same path on every node.",
             "set -euo pipefail",
             "",
             f"RUN_DIR={shlex.quote(str(run_dir))}",
             f"PYTHON={shlex.quote(python)}",
             "# the rendezvous is hosted on the allocation's first node, where this script runs",
             'HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
             "PORT=$((20000 + SLURM_JOB_ID % 20000))",
             "",
             "# `ddplab run` below starts, and watches, one torchrun agent per node:",
             *("#   " + line for line in _wrapped(shown)),
             f"export DDPLAB_NODES={nodes} DDPLAB_NODE_LAUNCHER=srun DDPLAB_RDZV_ENDPOINT=\"$HEAD:$PORT\"",
             "# srun inside the job takes the cores asked for above (SLURM 22.05+ no longer passes them on)",
             f"export SRUN_CPUS_PER_TASK={cpus}",
             "export DDPLAB_WARM=0   # one experiment: no session of warm ranks",
             f"# the agents wait up to {DEFAULT_JOIN_TIMEOUT_S} s for each other at the rendezvous",
             f'"$PYTHON" -m ddplab run{imports} --spec - --out "$RUN_DIR" <<\'DDPLAB_SPEC\'',
             spec,
             "DDPLAB_SPEC",
             ""]
    return "\n".join(lines)


def _wrapped(argv: list[str], width: int = 100) -> list[str]:
    """`argv` as shell words on lines of about `width` characters (for the comment)."""
    lines, line = [], ""
    for word in argv:
        word = word if word.startswith("--rdzv-") or word.startswith("$") else shlex.quote(word)
        if line and len(line) + len(word) + 1 > width:
            lines.append(line + " \\")
            line = "    " + word
        else:
            line = f"{line} {word}" if line else word
    return [*lines, line]
