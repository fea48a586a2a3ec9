"""A `%%ddp` cell inside one rank of a session: run the cell's code in this rank's namespace (kept
from cell to cell), capture what it prints and the value of its last expression, and say so in a
file the launcher reads (`cell{n}.rank{r}.json`). Runs inside a rank (`rank.worker --serve`).

The namespace starts with `rank`, `world_size`, `local_rank`, `device`, `torch`, `dist`, `nn` and
`F`, as a script started by torchrun would have them after `init_process_group`.
"""

from __future__ import annotations

import ast
import contextlib
import io
import time
import traceback

VALUE_CHARS = 2000   # the last expression's repr, cut to this


def namespace(env, device) -> dict:
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F

    return {"__name__": "__ddp_cell__", "rank": env.rank, "world_size": env.world_size,
            "local_rank": env.local_rank, "device": device, "torch": torch, "dist": dist, "nn": nn, "F": F}


def run_cell(code: str, ns: dict) -> dict:
    """Execute `code` in `ns` like a notebook cell: statements, then the last expression's value.
    Returns stdout, stderr, the value's repr (or None), the error (type, message, traceback) or None."""
    out, err = io.StringIO(), io.StringIO()
    value, error = None, None
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            tree = ast.parse(code, filename="<%%ddp cell>", mode="exec")
            last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
            exec(compile(tree, "<%%ddp cell>", "exec"), ns)
            if last is not None:
                result = eval(compile(ast.Expression(last.value), "<%%ddp cell>", "eval"), ns)
                if result is not None:
                    value = repr(result)
                    value = value if len(value) <= VALUE_CHARS else value[:VALUE_CHARS] + " ..."
        except BaseException as e:  # noqa: BLE001 - a cell's exception is its output, as in a notebook
            tb = traceback.format_exc()
            # drop the frames of this module: the learner's code starts at "<%%ddp cell>"
            lines = tb.splitlines(keepends=True)
            keep = [i for i, ln in enumerate(lines) if ln.lstrip().startswith('File "<%%ddp cell>"')]
            tb = lines[0] + "".join(lines[keep[0]:]) if keep else tb
            error = {"type": type(e).__name__, "message": str(e), "traceback": tb}
    return {"stdout": out.getvalue(), "stderr": err.getvalue(), "value": value, "error": error,
            "seconds": time.perf_counter() - t0}
