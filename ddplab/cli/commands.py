"""`ddplab run`, `slurm`, `doctor` and `lab`, and how every command turns an outcome into an exit code."""

from __future__ import annotations

import sys

from .flags import experiment_for


def attempt(command: str, call):
    """(call(), None), or (None, the exit code) once stderr says why: 2 for bad input (nothing was
    launched), 1 for a failed run (its diagnosis), 130 for Ctrl-C (the launcher has stopped every rank)."""
    from ..failures import RunFailed

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


def cmd_run(args) -> int:
    from .. import tables
    from ..launch.cold import run

    def launch():
        exp = experiment_for(args)
        return exp, run(exp, args.out)
    done, code = attempt("run", launch)
    if code is not None:
        return code
    exp, result = done
    import pandas as pd

    if exp.task.kind != "train":   # tables.ranks reads training steps; other tasks have their chapter's tables
        print(f"a {exp.task.kind} run on {exp.world_size} ranks finished; results in {result.path} "
              f"(ddplab.load_run(path) reads it, and the tables of its chapter show it)")
        return 3 if result.diverged() else 0
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(tables.ranks.rank_table(result).to_string())
    print(f"global batch {exp.global_batch} = sum of local batches {exp.local_batches} x accum_steps {exp.accum_steps}; "
          f"results in {result.path}")
    if result.diverged():   # the ranks ran as asked, the training did not: the launch's last line said where
        return 3
    return 0


def cmd_slurm(args) -> int:
    from ..launch.slurm import render

    def make():
        exp = experiment_for(args)
        return render(exp, args.nodes, args.out or f"runs/{exp.name}-{exp.hash}", gpus_per_node=args.gpus_per_node,
                      cpus_per_rank=args.cpus_per_rank, time_limit=args.time, partition=args.partition,
                      account=args.account)
    script, code = attempt("slurm", make)
    if code is not None:
        return code
    if args.script:
        from pathlib import Path

        Path(args.script).write_text(script)
        print(f"wrote {args.script}: submit it with sbatch {args.script}", file=sys.stderr)
    else:
        sys.stdout.write(script)
    return 0


def cmd_doctor(args) -> int:
    from ..doctor import check

    try:
        return 0 if check(print) else 1
    except ValueError as e:
        print(f"ddplab doctor: {e}", file=sys.stderr)
        return 2


def notebooks_dir():
    """The chapter notebooks: beside the package in a source checkout (`pip install -e .`)."""
    from pathlib import Path

    return Path(__file__).resolve().parent.parent.parent / "notebooks"


def lab_argv(extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "jupyterlab", str(notebooks_dir()), *extra]


def cmd_lab(args) -> int:
    import importlib.util
    import os
    import shlex

    where = notebooks_dir()
    if not where.is_dir():
        print(f"ddplab lab: no notebooks at {where}: run it from a checkout installed with pip install -e .",
              file=sys.stderr)
        return 1
    argv = lab_argv(args.jupyter_args)
    if args.print_command:
        print(shlex.join(argv))   # quoted as a shell reads it: a path may hold a space
        return 0
    if importlib.util.find_spec("jupyterlab") is None:
        print('ddplab lab: JupyterLab is not installed: pip install -e ".[notebooks]"', file=sys.stderr)
        return 1
    os.execv(argv[0], argv)   # JupyterLab takes over this process (its Ctrl-C, its exit code)
