"""`ddplab audit` and `ddplab tune-buckets`: the practitioner tools on a user's own model."""

from __future__ import annotations

import argparse
import math
import sys

from ..spec import Experiment
from ..spec.compiled_ddp import BACKENDS, MODES
from .commands import attempt
from .flags import RUN_FLAGS


# the Experiment fields the practitioner tools take from the command line (the model's sizes, the data)
FACTORY_SIZES = ("vocab_size", "d_model", "n_layers", "n_heads", "tie_weights")   # passed to a factory that takes them
TOOL_FIELDS = ("vocab_size", "d_model", "n_layers", "n_heads", "tie_weights", "seq_len", "dtype", "seed", "timeout_s")
AUDIT_FIELDS = ("optimizer", "lr", "momentum", "bucket_cap_mb", "gradient_as_bucket_view", *TOOL_FIELDS)


def add_tool_flags(p, fields) -> None:
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
    p.add_argument("--compile", nargs="?", const="aot_eager", default=None, choices=BACKENDS, metavar="BACKEND",
                   help="also run your model under torch.compile beside eager on the same ranks: the graphs, "
                        "DDPOptimizer's split against DDP's buckets, the step (BACKEND: aot_eager, the default, "
                        "inductor or eager)")
    p.add_argument("--compile-mode", default=None, choices=MODES,
                   help="torch._dynamo.config.optimize_ddp under --compile (default ddp_optimizer, torch's)")
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
    if args.compile_mode is not None and args.compile is None:
        print(f"ddplab {args.command}: --compile-mode {args.compile_mode} needs --compile", file=sys.stderr)
        return 2
    if args.compile is not None:
        given |= {"compile_backend": args.compile, "compile_mode": args.compile_mode or "ddp_optimizer"}
    report, code = attempt(args.command, lambda: call(given))
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


def cmd_audit(args) -> int:
    from ..tools import audit_model

    return _tool(args, AUDIT_FIELDS, lambda given: audit_model(
        args.model, args.world_size, local_batch=args.local_batch, out=args.out, progress=not args.quiet, **given))


def cmd_tune(args) -> int:
    from ..tools import tune_buckets

    def call(given):
        caps = {} if args.caps is None else {"caps_mb": args.caps}
        return tune_buckets(args.model, args.world_size, local_batch=args.local_batch, measure=args.measure,
                            rounds=args.rounds, steps=args.steps, out=args.out, progress=not args.quiet, **caps, **given)
    return _tool(args, TOOL_FIELDS, call)


def caps(text: str) -> tuple[float, ...]:
    try:
        caps = tuple(float(p) for p in text.split(",") if p)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected caps in MiB separated by commas, got {text!r}") from None
    if not all(math.isfinite(c) and c > 0 for c in caps):
        raise argparse.ArgumentTypeError(f"every cap is a finite number of MiB above 0, got {text!r}")
    return caps
