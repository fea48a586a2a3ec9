"""The `ddplab` command.

    ddplab run --world-size 4 --local-batch 16 --steps 3     # real torchrun ranks, per-rank table
    ddplab run --world-size 2 --fault crash --fault-rank 1   # a failure, diagnosed
    ddplab doctor                                            # versions, backends, GPUs, a 2-rank all-reduce
Used by the README's first command and notebook-free use; every notebook can do the same from Python.
"""

from __future__ import annotations

import argparse
import sys

from .spec import Experiment, Fault


def _ints(text: str):
    """'16' -> 16; '16,8' -> (16, 8)."""
    parts = [int(p) for p in text.split(",")]
    return parts[0] if len(parts) == 1 else tuple(parts)


def _optional_float(text: str):
    return None if text.lower() in ("none", "default") else float(text)


# flag -> (Experiment field, type, help)
RUN_FLAGS = {
    "--name": ("name", str, "run name (names the run directory)"),
    "--model": ("model", str, "transformer, mlp, or package.module:factory"),
    "--vocab-size": ("vocab_size", int, "tokens in the vocabulary"),
    "--d-model": ("d_model", int, "width of the built-in models"),
    "--n-layers": ("n_layers", int, "blocks (transformer) or hidden layers (mlp)"),
    "--n-heads": ("n_heads", int, "attention heads (transformer)"),
    "--world-size": ("world_size", int, "number of ranks"),
    "--local-batch": ("local_batch", _ints, "examples per rank per micro-step: N, or N0,N1,... one per rank"),
    "--seq-len": ("seq_len", _ints, "tokens per example: N, or one per rank"),
    "--accum-steps": ("accum_steps", int, "micro-steps per optimizer step"),
    "--steps": ("steps", int, "optimizer steps"),
    "--sync": ("sync", str, "ddp (average gradients) or none (each rank steps alone)"),
    "--bucket-cap-mb": ("bucket_cap_mb", _optional_float, "DDP bucket cap in MiB, or 'none' for the default"),
    "--optimizer": ("optimizer", str, "sgd, adam or adamw"),
    "--lr": ("lr", float, "learning rate"),
    "--seed": ("seed", int, "seed for the model and the data"),
    "--backend": ("backend", str, "auto, gloo or nccl"),
    "--device": ("device", str, "auto, cpu or cuda"),
    "--timeout": ("timeout_s", float, "seconds a rank may wait in one collective"),
}
# flag -> (Fault field, type, help)
FAULT_FLAGS = {
    "--fault": ("kind", str, "inject a failure: crash, skip-backward or stall"),
    "--fault-rank": ("rank", int, "rank that fails (default: the last)"),
    "--fault-step": ("step", int, "step in which it fails"),
}


def experiment_from_args(args: argparse.Namespace) -> Experiment:
    def given(flags):
        values = {field: getattr(args, flag[2:].replace("-", "_")) for flag, (field, _, _) in flags.items()}
        return {k: v for k, v in values.items() if v is not None}
    fault = given(FAULT_FLAGS)
    if fault and "kind" not in fault:
        raise ValueError("Experiment.fault: --fault-rank and --fault-step need --fault")
    return Experiment(**given(RUN_FLAGS), **({"fault": Fault(**fault)} if fault else {}))


def _cmd_run(args) -> int:
    from . import tables
    from .failures import RunFailed
    from .launch.cold import run

    try:
        exp = experiment_from_args(args)
        result = run(exp, args.out)
    except ValueError as e:
        print(f"ddplab run: {e}", file=sys.stderr)
        return 2
    except RunFailed as e:
        print(f"ddplab run FAILED\n{e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:   # the launcher has already stopped every rank
        print(f"ddplab run: {e or 'interrupted'}", file=sys.stderr)
        return 130
    import pandas as pd

    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(tables.ranks(result).to_string())
    print(f"global batch {exp.global_batch} = sum of local batches {exp.local_batches} x accum_steps {exp.accum_steps}; "
          f"results in {result.path}")
    return 0


def _cmd_doctor(args) -> int:
    from .doctor import doctor

    return 0 if doctor(print) else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="ddplab", description="A hands-on lab for data-parallel training.")
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="run an experiment on real torchrun ranks and print a per-rank table")
    for flag, (_, kind, help_text) in {**RUN_FLAGS, **FAULT_FLAGS}.items():
        p_run.add_argument(flag, type=kind, default=None, help=help_text)
    p_run.add_argument("--out", default=None, help="run directory (default runs/<name>-<hash>)")
    p_run.set_defaults(func=_cmd_run)
    p_doc = sub.add_parser("doctor", help="versions, backends, GPUs, and a real 2-rank all-reduce")
    p_doc.set_defaults(func=_cmd_doctor)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
