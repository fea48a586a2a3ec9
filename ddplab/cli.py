"""The `ddplab` command.

    ddplab run --world-size 4 --local-batch 16 --steps 3     # real torchrun ranks, per-rank table
    ddplab run --world-size 2 --fault crash --fault-rank 1   # a failure, diagnosed
    ddplab audit --model mypkg.models:build --world-size 4   # your own model: memory, buckets, bytes, compute/comm
    ddplab tune-buckets --model mypkg.models:build           # a measured bucket_cap_mb recommendation
    ddplab doctor                                            # versions, backends, GPUs, a 2-rank all-reduce
    ddplab doctor --nodes 2                                  # can the nodes talk? (2 agents here, or srun)
    ddplab slurm --world-size 16 --nodes 2 --gpus-per-node 8 > job.sbatch   # a SLURM batch script
    ddplab lab                                               # JupyterLab on the chapter notebooks
Used by the README's first command and notebook-free use; every notebook can do the same from Python.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys

from .spec import Experiment, Fault, Straggler, experiment
from .spec.fault import FAULT_KINDS
from .spec.link import LINKS
from .spec.straggler import WHERE as STRAGGLER_WHERE


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


# what each Experiment field means on the command line; choices come from the spec itself
HELP = {
    "name": "run name (names the run directory)",
    "model": f"{', '.join(experiment.BUILTIN_MODELS)}, or package.module:factory (importable from here)",
    "vocab_size": "tokens in the vocabulary", "d_model": "width of the built-in models",
    "n_layers": "blocks (transformer) or hidden layers (mlp)", "n_heads": "attention heads (transformer)",
    "tie_weights": "transformer: the LM head reuses the token embedding",
    "checkpointing": "transformer: recompute each block's activations in backward",
    "world_size": "number of ranks",
    "local_batch": "examples per rank per micro-step: N, or N0,N1,... one per rank",
    "seq_len": "tokens per example: N, or one per rank", "accum_steps": "micro-steps per optimizer step",
    "no_sync": "skip the all-reduce on all but the last micro-step", "steps": "optimizer steps",
    "sync": f"{' or '.join(experiment.SYNC_MODES)}: DDP averages gradients, or each rank steps alone",
    "loss_norm": f"how a rank's loss is normalized: {', '.join(experiment.LOSS_NORMS)}",
    "dtype": ", ".join(experiment.DTYPES), "sharding": ", ".join(experiment.SHARDING),
    "bucket_cap_mb": "DDP bucket cap in MiB, or 'none' for the default",
    "gradient_as_bucket_view": "DDP: gradients are views into the buckets",
    "find_unused_parameters": "DDP: find parameters the forward did not use",
    "distributed_debug": "off, or info: torch's TORCH_DISTRIBUTED_DEBUG level for DDP (names unused parameters)",
    "optimizer": ", ".join(experiment.OPTIMIZERS), "lr": "learning rate", "momentum": "SGD momentum",
    "seed": "seed for the model and the data", "seed_per_rank": "rank r builds its model from seed + r",
    "backend": ", ".join(experiment.BACKENDS), "device": ", ".join(experiment.DEVICES),
    "timeout_s": "seconds a rank may wait in one collective", "pin_cpus": "pin rank r to core r mod cores",
    "probes": f"comma-separated: {', '.join(experiment.PROBES)}",
    "link": f"hold DDP's all-reduces to an emulated link (needs --probes buckets): {', '.join(LINKS)}, "
            "or LATENCY_US:GBIT_S such as 100:2; default none (loopback as it is)",
}
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


def _experiment(args) -> Experiment:
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
    return Experiment.from_json(text)


def _nodes_to_env(args) -> None:
    """--nodes, --node-launcher and --rdzv-endpoint as $DDPLAB_NODES and co., for every launch of this
    command (its session too); refused here, before anything starts, if they make no layout."""
    import os

    from .launch.nodes import Nodes

    flags = {"count": getattr(args, "nodes", None), "launcher": getattr(args, "node_launcher", None),
             "endpoint": getattr(args, "rdzv_endpoint", None)}
    Nodes(**{k: v for k, v in flags.items() if v is not None})   # "nodes: ..." names what is wrong
    for field, var in (("count", "DDPLAB_NODES"), ("launcher", "DDPLAB_NODE_LAUNCHER"),
                       ("endpoint", "DDPLAB_RDZV_ENDPOINT")):
        if flags[field] is not None:
            os.environ[var] = str(flags[field])
    Nodes.from_env()


def _add_node_flags(p) -> None:
    p.add_argument("--nodes", type=int, default=None, help="nodes to spread the ranks over (default 1; "
                   "$DDPLAB_NODES): torchrun agents on this host, or one per node with --node-launcher srun")
    p.add_argument("--node-launcher", choices=("local", "srun"), default=None,
                   help="local: every node's agent on this host; srun: one agent per node of this SLURM allocation")
    p.add_argument("--rdzv-endpoint", default=None, help="srun: host:port of the rendezvous (default: the "
                   "allocation's first node)")


def _cmd_slurm(args) -> int:
    from .launch.slurm import render

    def make():
        exp = _experiment(args)
        return render(exp, args.nodes, args.out or f"runs/{exp.name}-{exp.hash}", gpus_per_node=args.gpus_per_node,
                      cpus_per_rank=args.cpus_per_rank, time_limit=args.time, partition=args.partition,
                      account=args.account)
    script, code = _attempt("slurm", make)
    if code is not None:
        return code
    if args.script:
        from pathlib import Path

        Path(args.script).write_text(script)
        print(f"wrote {args.script}: submit it with sbatch {args.script}", file=sys.stderr)
    else:
        sys.stdout.write(script)
    return 0


def _attempt(command: str, call):
    """(call(), None), or (None, the exit code) once stderr says why: 2 for bad input (nothing was
    launched), 1 for a failed run (its diagnosis), 130 for Ctrl-C (the launcher has stopped every rank)."""
    from .failures import RunFailed

    try:
        return call(), None
    except ValueError as e:
        print(f"ddplab {command}: {e}", file=sys.stderr)
        return None, 2
    except RunFailed as e:
        print(f"ddplab {command} FAILED\n{e}", file=sys.stderr)
        return None, 1
    except KeyboardInterrupt as e:
        print(f"ddplab {command}: {e or 'interrupted'}", file=sys.stderr)
        return None, 130


def _cmd_run(args) -> int:
    from . import tables
    from .launch.cold import run

    def launch():
        exp = _experiment(args)
        return exp, run(exp, args.out)
    done, code = _attempt("run", launch)
    if code is not None:
        return code
    exp, result = done
    import pandas as pd

    if exp.task.kind != "train":   # tables.ranks reads training steps; other tasks have their chapter's tables
        print(f"a {exp.task.kind} run on {exp.world_size} ranks finished; results in {result.path} "
              f"(ddplab.load_run(path) reads it, and the tables of its chapter show it)")
        return 3 if result.diverged() else 0
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(tables.rank_table(result).to_string())
    print(f"global batch {exp.global_batch} = sum of local batches {exp.local_batches} x accum_steps {exp.accum_steps}; "
          f"results in {result.path}")
    if result.diverged():   # the ranks ran as asked, the training did not: the launch's last line said where
        return 3
    return 0


# the Experiment fields the practitioner tools take from the command line (the model's sizes, the data)
FACTORY_SIZES = ("vocab_size", "d_model", "n_layers", "n_heads", "tie_weights")   # passed to a factory that takes them
TOOL_FIELDS = ("vocab_size", "d_model", "n_layers", "n_heads", "tie_weights", "seq_len", "dtype", "seed", "timeout_s")
AUDIT_FIELDS = ("optimizer", "lr", "momentum", "bucket_cap_mb", "gradient_as_bucket_view", *TOOL_FIELDS)


def _add_tool_flags(p, fields) -> None:
    p.add_argument("--model", required=True, help="your model factory, package.module:function (importable from "
                                                  "here; the contract: ddplab/spec/model.py)")
    p.add_argument("--world-size", type=int, default=4, help="number of ranks (default 4)")
    p.add_argument("--local-batch", type=int, default=8, help="examples per rank per step (default 8)")
    for flag, (name, kind, help_text) in RUN_FLAGS.items():
        if name in fields:
            if name in FACTORY_SIZES:
                help_text = f"{name} for your factory, if it takes it (default {getattr(Experiment(), name)})"
            p.add_argument(flag, type=kind, default=None, dest=name, help=help_text)
    p.add_argument("--json", nargs="?", const="-", default=None, metavar="PATH",
                   help="also write the report as JSON to PATH; without PATH, print JSON instead of text")
    p.add_argument("--out", default=None, help="launch directory (default runs/<tool>-<factory>-<hash>)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def _tool(args, fields, call) -> int:
    import json

    given = {f: getattr(args, f) for f in fields if getattr(args, f, None) is not None}
    if args.json not in (None, "-"):
        from pathlib import Path

        import os

        target = Path(args.json).resolve()
        why = (f"no directory {target.parent}" if not target.parent.is_dir() else
               "is a directory; give a file name" if target.is_dir() else
               f"cannot write in {target.parent}" if not os.access(target.parent, os.W_OK) else
               "cannot write it" if target.exists() and not os.access(target, os.W_OK) else None)
        if why:   # before the launch, not after it
            print(f"ddplab {args.command}: --json {args.json}: {why}", file=sys.stderr)
            return 2
    report, code = _attempt(args.command, lambda: call(given))
    if code is not None:
        return code
    data = json.dumps(report.to_dict(), indent=2, allow_nan=False)
    if args.json == "-":
        print(data)
        return 0
    print(report.text())
    if args.json is not None:
        from pathlib import Path

        Path(args.json).write_text(data + "\n")
        print(f"the same as data: {args.json}")
    return 0


def _cmd_audit(args) -> int:
    from .tools import audit_model

    return _tool(args, AUDIT_FIELDS, lambda given: audit_model(
        args.model, args.world_size, local_batch=args.local_batch, out=args.out, progress=not args.quiet, **given))


def _cmd_tune(args) -> int:
    from .tools import tune_buckets

    def call(given):
        caps = {} if args.caps is None else {"caps_mb": args.caps}
        return tune_buckets(args.model, args.world_size, local_batch=args.local_batch, measure=args.measure,
                            rounds=args.rounds, steps=args.steps, out=args.out, progress=not args.quiet, **caps, **given)
    return _tool(args, TOOL_FIELDS, call)


def _caps(text: str) -> tuple[float, ...]:
    try:
        caps = tuple(float(p) for p in text.split(",") if p)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected caps in MiB separated by commas, got {text!r}") from None
    if not all(math.isfinite(c) and c > 0 for c in caps):
        raise argparse.ArgumentTypeError(f"every cap is a finite number of MiB above 0, got {text!r}")
    return caps


def _cmd_doctor(args) -> int:
    from .doctor import check

    try:
        return 0 if check(print) else 1
    except ValueError as e:
        print(f"ddplab doctor: {e}", file=sys.stderr)
        return 2


def _run_flags(p, spec: bool = True) -> None:
    for flag, (_, kind, help_text) in {**RUN_FLAGS, **FAULT_FLAGS, **STRAGGLER_FLAGS}.items():
        p.add_argument(flag, type=kind, default=None, help=help_text)
    if spec:
        p.add_argument("--spec", default=None, help="the experiment as a spec.json file (- reads stdin), "
                                                    "instead of the flags above")
        p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                       help="import MODULE first: where your own task is declared (a spec names it, and "
                            "ddplab never imports what a file names); repeat for several")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ddplab", description="A hands-on lab for data-parallel training.")
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="run an experiment on real torchrun ranks and print a per-rank table")
    _run_flags(p_run)
    p_run.add_argument("--out", default=None, help="run directory (default runs/<name>-<hash>)")
    _add_node_flags(p_run)
    p_run.set_defaults(func=_cmd_run)
    p_aud = sub.add_parser("audit", help="one launch on your own model: memory per rank, DDP's buckets, ready order, "
                                         "bytes on the wire, compute against communication")
    _add_tool_flags(p_aud, AUDIT_FIELDS)
    _add_node_flags(p_aud)
    p_aud.set_defaults(func=_cmd_audit)
    p_tune = sub.add_parser("tune-buckets", help="capture, predict and measure bucket plans for your own model, "
                                                 "and recommend a bucket_cap_mb")
    _add_tool_flags(p_tune, TOOL_FIELDS)
    p_tune.add_argument("--caps", type=_caps, default=None, help="candidate caps in MiB, e.g. 0.5,1,4,16 (default: "
                                                                 "from one tensor per bucket to 256)")
    p_tune.add_argument("--measure", type=int, default=2, help="how many of the plans predicted fastest to measure")
    p_tune.add_argument("--rounds", type=int, default=4, help="interleaved rounds of the measurement")
    p_tune.add_argument("--steps", type=int, default=3, help="steps of each plan per round")
    _add_node_flags(p_tune)
    p_tune.set_defaults(func=_cmd_tune)
    p_doc = sub.add_parser("doctor", help="versions, backends, GPUs, and a real all-reduce (2 ranks; 2 per node "
                                          "with --nodes: can the nodes talk?)")
    _add_node_flags(p_doc)
    p_doc.set_defaults(func=_cmd_doctor)
    p_slurm = sub.add_parser("slurm", help="write a SLURM batch script that runs an experiment over several nodes "
                                           "(sbatch, srun, torchrun)")
    _run_flags(p_slurm)
    p_slurm.add_argument("--nodes", type=int, required=True, help="nodes to ask SLURM for")
    p_slurm.add_argument("--gpus-per-node", type=int, default=0, help="GPUs to ask for on each node (default 0)")
    p_slurm.add_argument("--cpus-per-rank", type=int, default=2, help="CPU cores to ask for per rank (default 2)")
    p_slurm.add_argument("--time", default="00:30:00", help="the job's time limit, SLURM's --time (default 00:30:00)")
    p_slurm.add_argument("--partition", default=None, help="SLURM partition")
    p_slurm.add_argument("--account", default=None, help="SLURM account")
    p_slurm.add_argument("--out", default=None, help="run directory, on a filesystem every node sees "
                                                     "(default runs/<name>-<hash>, made absolute)")
    p_slurm.add_argument("--script", default=None, help="write the script here (default: print it)")
    p_slurm.set_defaults(func=_cmd_slurm)
    p_lab = sub.add_parser("lab", help="open JupyterLab on the chapter notebooks")
    p_lab.add_argument("--print-command", action="store_true", help="print the command instead of running it")
    p_lab.add_argument("jupyter_args", nargs=argparse.REMAINDER, help="passed on to `jupyter lab`")
    p_lab.set_defaults(func=_cmd_lab)
    return parser


def notebooks_dir():
    """The chapter notebooks: beside the package in a source checkout (`pip install -e .`)."""
    from pathlib import Path

    return Path(__file__).resolve().parent.parent / "notebooks"


def lab_argv(extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "jupyterlab", str(notebooks_dir()), *extra]


def _cmd_lab(args) -> int:
    import importlib.util
    import os

    where = notebooks_dir()
    if not where.is_dir():
        print(f"ddplab lab: no notebooks at {where}: run it from a checkout installed with pip install -e .",
              file=sys.stderr)
        return 1
    argv = lab_argv(args.jupyter_args)
    if args.print_command:
        print(" ".join(argv))
        return 0
    if importlib.util.find_spec("jupyterlab") is None:
        print('ddplab lab: JupyterLab is not installed: pip install -e ".[dev]"', file=sys.stderr)
        return 1
    os.execv(argv[0], argv)   # JupyterLab takes over this process (its Ctrl-C, its exit code)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.command != "slurm":   # slurm's --nodes is what it asks SLURM for, not where this process launches
        try:
            _nodes_to_env(args)
        except ValueError as e:
            print(f"ddplab {args.command}: {e}", file=sys.stderr)
            return 2
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
