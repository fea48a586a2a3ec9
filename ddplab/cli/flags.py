"""The command line's flags: one per Experiment field, the fault and straggler sections, the nodes;
and the experiment they (or a --spec file) describe."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from ..spec import Experiment, Fault, Straggler, experiment
from ..spec.fault import FAULT_KINDS
from ..spec.straggler import WHERE as STRAGGLER_WHERE


def _ints(text: str):
    """'16' -> 16; '16,8' -> (16, 8)."""
    parts = [int(p) for p in text.split(",")]
    return parts[0] if len(parts) == 1 else tuple(parts)


def _optional_float(text: str):
    return None if text.lower() in ("none", "default") else float(text)


def _link(text: str):
    """A preset name (10GbE, 1GbE, slow) or LATENCY_US:GBIT_S, e.g. 100:2; 'none' for loopback alone."""
    if text.lower() == "none":
        return None
    if ":" in text:
        latency, gbit = text.split(":", 1)
        return {"name": text, "latency_us": float(latency), "gbit_s": float(gbit)}
    return text


def _names(text: str) -> tuple[str, ...]:
    return tuple(p for p in text.split(",") if p)


def _bool(text: str) -> bool:
    if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return text.lower() in ("true", "1", "yes")


# what each Experiment field means: its docstring in the spec (`spec.experiment.field_docs`), written once
HELP = experiment.field_docs()
FAULT_HELP = {"kind": f"inject a failure: {', '.join(FAULT_KINDS)}", "rank": "rank that fails (default: the last)",
              "step": "step in which it fails"}
TYPES = {int: int, float: float, str: str, bool: _bool}
SPECIAL = {"local_batch": _ints, "seq_len": _ints, "bucket_cap_mb": _optional_float, "probes": _names, "link": _link}
FLAG_NAMES = {"timeout_s": "--timeout"}


def run_flags() -> dict[str, tuple[str, object, str]]:
    """flag -> (Experiment field, type, help), one flag for every field the command line can set."""
    flags = {}
    for f in dataclasses.fields(Experiment):
        if f.name in ("task", "fault", "straggler"):   # sections: the train task, FAULT_FLAGS, STRAGGLER_FLAGS
            continue
        kind = SPECIAL.get(f.name) or TYPES[type(getattr(Experiment(), f.name))]
        flags[FLAG_NAMES.get(f.name, "--" + f.name.replace("_", "-"))] = (f.name, kind, HELP[f.name])
    return flags


RUN_FLAGS = run_flags()


# flag -> (Fault field, type, help)
FAULT_FLAGS = {"--fault": ("kind", str, FAULT_HELP["kind"]), "--fault-rank": ("rank", int, FAULT_HELP["rank"]),
               "--fault-step": ("step", int, FAULT_HELP["step"])}


# flag -> (Straggler field, type, help)
STRAGGLER_FLAGS = {"--straggler": ("where", str, f"slow one rank every step: {', '.join(STRAGGLER_WHERE)}"),
                   "--straggler-rank": ("rank", int, "the slow rank (default 1)"),
                   "--straggler-ms": ("ms", float, "how much slower, ms per step (default 20)")}


def experiment_from_args(args: argparse.Namespace) -> Experiment:
    def given(flags):
        values = {field: getattr(args, flag[2:].replace("-", "_")) for flag, (field, _, _) in flags.items()}
        return {k: v for k, v in values.items() if v is not None}
    fault, slow = given(FAULT_FLAGS), given(STRAGGLER_FLAGS)
    if fault and "kind" not in fault:
        raise ValueError("Experiment.fault: --fault-rank and --fault-step need --fault")
    if slow and "where" not in slow:
        raise ValueError("Experiment.straggler: --straggler-rank and --straggler-ms need --straggler")
    return Experiment(**given(RUN_FLAGS), **({"fault": Fault(**fault)} if fault else {}),
                      **({"straggler": Straggler(**slow)} if slow else {}))


def experiment_for(args) -> Experiment:
    """The experiment of `run` and `slurm`: from --spec (a spec.json, or - for stdin) or from the flags."""
    if getattr(args, "spec", None) is None:
        if getattr(args, "imports", None):
            raise ValueError(f"--import {args.imports[0]}: imports the module of a task that a --spec file names; "
                             f"without --spec there is none to import: drop --import, or give --spec")
        return experiment_from_args(args)
    given = [flag for flag in {**RUN_FLAGS, **FAULT_FLAGS, **STRAGGLER_FLAGS}
             if getattr(args, flag[2:].replace("-", "_")) is not None]
    if given:
        raise ValueError(f"spec: --spec gives the whole experiment; drop {', '.join(given)}")
    from pathlib import Path

    import importlib

    for name in args.imports:   # the user's own task modules, named on the command line, not by the file
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise ValueError(f"--import {name}: cannot import it ({e})") from None
    try:
        text = sys.stdin.read() if args.spec == "-" else Path(args.spec).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"spec: cannot read {args.spec} ({getattr(e, 'strerror', None) or e})") from None
    where = "stdin" if args.spec == "-" else args.spec
    try:
        return Experiment.from_json(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"spec: {where} is not JSON ({e}); give the spec.json of a run, or "
                         f"Experiment.to_json()'s text") from None
    except ValueError as e:   # a field the spec gets wrong: the message names it; say which file held it
        raise ValueError(f"spec: {where}: {e}") from None


def add_run_flags(p, spec: bool = True) -> None:
    for flag, (_, kind, help_text) in {**RUN_FLAGS, **FAULT_FLAGS, **STRAGGLER_FLAGS}.items():
        p.add_argument(flag, type=kind, default=None, help=help_text)
    if spec:
        p.add_argument("--spec", default=None, help="the experiment as a spec.json file (- reads stdin), "
                                                    "instead of the flags above")
        p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                       help="import MODULE first: where your own task is declared (a spec names it, and "
                            "ddplab never imports what a file names); repeat for several")


def nodes_to_env(args) -> None:
    """--nodes, --node-launcher and --rdzv-endpoint as $DDPLAB_NODES and co., for every launch of this
    command (its session too); refused here, before anything starts, if they make no layout."""
    import os

    from ..launch.nodes import Nodes

    flags = {"count": getattr(args, "nodes", None), "launcher": getattr(args, "node_launcher", None),
             "endpoint": getattr(args, "rdzv_endpoint", None)}
    Nodes(**{k: v for k, v in flags.items() if v is not None})   # "nodes: ..." names what is wrong
    for field, var in (("count", "DDPLAB_NODES"), ("launcher", "DDPLAB_NODE_LAUNCHER"),
                       ("endpoint", "DDPLAB_RDZV_ENDPOINT")):
        if flags[field] is not None:
            os.environ[var] = str(flags[field])
    Nodes.from_env()


def add_node_flags(p) -> None:
    p.add_argument("--nodes", type=int, default=None, help="nodes to spread the ranks over (default 1; "
                   "$DDPLAB_NODES): torchrun agents on this host, or one per node with --node-launcher srun")
    p.add_argument("--node-launcher", choices=("local", "srun"), default=None,
                   help="local: every node's agent on this host; srun: one agent per node of this SLURM allocation")
    p.add_argument("--rdzv-endpoint", default=None, help="srun: host:port of the rendezvous (default: the "
                   "allocation's first node)")
