"""The `ddplab` command: flags.py (one flag per Experiment field), commands.py (run, slurm, doctor, lab),
tools.py (audit, tune-buckets), plan.py (plan).

    ddplab run --world-size 4 --local-batch 16 --steps 3     # real torchrun ranks, per-rank table
    ddplab run --world-size 2 --fault crash --fault-rank 1   # a failure, diagnosed
    ddplab audit --model mypkg.models:build --world-size 4   # your own model: memory, buckets, bytes, compute/comm
    ddplab tune-buckets --model mypkg.models:build           # a measured bucket_cap_mb recommendation
    ddplab plan --model hf:llama-2-7b --world-sizes 8,64,1024 --seq-len 2048 --local-batch 1   # at scale, here
    ddplab doctor                                            # versions, backends, GPUs, a 2-rank all-reduce
    ddplab doctor --nodes 2                                  # can the nodes talk? (2 agents here, or srun)
    ddplab slurm --world-size 16 --nodes 2 --gpus-per-node 8 > job.sbatch   # a SLURM batch script
    ddplab lab                                               # JupyterLab on the chapter notebooks
Used by the README's first command and notebook-free use; every notebook can do the same from Python.
"""

from __future__ import annotations

import argparse
import sys

from ..spec import Fault, Straggler
from .plan import add_plan_flags, cmd_plan
from .commands import cmd_doctor, cmd_lab, cmd_run, cmd_slurm, notebooks_dir
from .flags import FAULT_FLAGS, RUN_FLAGS, STRAGGLER_FLAGS, add_node_flags, nodes_to_env, add_run_flags, experiment_from_args
from .tools import AUDIT_FIELDS, TOOL_FIELDS, add_tool_flags, caps, cmd_audit, cmd_tune

__all__ = ["FAULT_FLAGS", "RUN_FLAGS", "STRAGGLER_FLAGS", "Fault", "Straggler", "build_parser", "experiment_from_args",
           "main", "notebooks_dir"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ddplab", description="A hands-on lab for data-parallel training.")
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="run an experiment on real torchrun ranks and print a per-rank table")
    add_run_flags(p_run)
    p_run.add_argument("--out", default=None, help="run directory (default runs/<name>-<hash>)")
    add_node_flags(p_run)
    p_run.set_defaults(func=cmd_run)
    p_aud = sub.add_parser("audit", help="one launch on your own model: memory per rank, DDP's buckets, ready order, "
                                         "bytes on the wire, compute against communication")
    add_tool_flags(p_aud, AUDIT_FIELDS)
    add_node_flags(p_aud)
    p_aud.set_defaults(func=cmd_audit)
    p_tune = sub.add_parser("tune-buckets", help="capture, predict and measure bucket plans for your own model, "
                                                 "and recommend a bucket_cap_mb")
    add_tool_flags(p_tune, TOOL_FIELDS)
    p_tune.add_argument("--caps", type=caps, default=None, help="candidate caps in MiB, e.g. 0.5,1,4,16 (default: "
                                                                 "from one tensor per bucket to 256)")
    p_tune.add_argument("--measure", type=int, default=2, help="how many of the plans predicted fastest to measure")
    p_tune.add_argument("--rounds", type=int, default=4, help="interleaved rounds of the measurement")
    p_tune.add_argument("--steps", type=int, default=3, help="steps of each plan per round")
    add_node_flags(p_tune)
    p_tune.set_defaults(func=cmd_tune)
    p_plan = sub.add_parser("plan", help="plan a model at a cluster's world sizes on this machine: memory per rank, "
                                         "collectives, FLOPs (torch's own code on a fake process group)")
    add_plan_flags(p_plan)
    p_plan.set_defaults(func=cmd_plan)
    p_doc = sub.add_parser("doctor", help="versions, backends, GPUs, and a real all-reduce (2 ranks; 2 per node "
                                          "with --nodes: can the nodes talk?)")
    add_node_flags(p_doc)
    p_doc.set_defaults(func=cmd_doctor)
    p_slurm = sub.add_parser("slurm", help="write a SLURM batch script that runs an experiment over several nodes "
                                           "(sbatch, srun, torchrun)")
    add_run_flags(p_slurm)
    p_slurm.add_argument("--nodes", type=int, required=True, help="nodes to ask SLURM for")
    p_slurm.add_argument("--gpus-per-node", type=int, default=0, help="GPUs to ask for on each node (default 0)")
    p_slurm.add_argument("--cpus-per-rank", type=int, default=2, help="CPU cores to ask for per rank (default 2)")
    p_slurm.add_argument("--time", default="00:30:00", help="the job's time limit, SLURM's --time (default 00:30:00)")
    p_slurm.add_argument("--partition", default=None, help="SLURM partition")
    p_slurm.add_argument("--account", default=None, help="SLURM account")
    p_slurm.add_argument("--out", default=None, help="run directory, on a filesystem every node sees "
                                                     "(default runs/<name>-<hash>, made absolute)")
    p_slurm.add_argument("--script", default=None, help="write the script here (default: print it)")
    p_slurm.set_defaults(func=cmd_slurm)
    p_lab = sub.add_parser("lab", help="open JupyterLab on the chapter notebooks",
                           usage="ddplab lab [--print-command] [JupyterLab's own arguments, e.g. --no-browser --port=0]")
    p_lab.add_argument("--print-command", action="store_true", help="print the command instead of running it")
    p_lab.add_argument("jupyter_args", nargs="*", help="passed on to `jupyter lab` as they are (a `--` before them "
                                                       "is allowed and dropped)")
    p_lab.set_defaults(func=cmd_lab)
    return parser


def lab_args(rest: list[str]) -> argparse.Namespace | None:
    """`ddplab lab`'s own arguments and JupyterLab's, in their order (argparse would read `--no-browser` or
    `--port=0` as ddplab's own and refuse them). None where the user asked for ddplab's help."""
    before = rest[: rest.index("--")] if "--" in rest else rest
    if "-h" in before or "--help" in before:
        return None
    ours = [a for a in before if a == "--print-command"]
    theirs = [a for a in before if a != "--print-command"] + rest[len(before) + 1:]
    return argparse.Namespace(command="lab", func=cmd_lab, print_command=bool(ours), jupyter_args=theirs)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["lab"] and (args := lab_args(argv[1:])) is not None:
        return args.func(args)
    args = build_parser().parse_args(argv)
    if args.command not in ("slurm", "plan"):   # slurm's --nodes is what it asks SLURM for, not where this process launches
        try:
            nodes_to_env(args)
        except ValueError as e:
            print(f"ddplab {args.command}: {e}", file=sys.stderr)
            return 2
    return args.func(args)

