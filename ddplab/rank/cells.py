"""A `%%ddp` cell inside one rank of a session: run the cell's code in this rank's namespace (kept
from cell to cell), capture what it prints and the value of its last expression, and say so in a
file the launcher reads (`job{n}.rank{r}.cell.json`). Runs inside a rank (`rank.worker --serve`).

The namespace starts with `rank`, `world_size`, `local_rank`, `device`, `torch`, `dist`, `nn` and
`F`, as a script started by torchrun would have them after `init_process_group`, and `lab`: the
lab's own probes for the loop you type (`Lab`: a memory ledger, gradient-ready times, bucket events).
Its `dist` is torch.distributed with each collective's call noted first (`TracedDist`), so a cell
that hangs can be explained.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import io
import time
import traceback

from . import clock

VALUE_CHARS = 2000   # the last expression's repr, cut to this
STREAM_CHARS = 256 * 1024   # what a cell prints is also streamed to the launcher live, up to this much


class _Streamed(io.StringIO):
    """A cell's stdout or stderr: kept whole for its answer, and written through, line by line, to the
    rank's stream file (shared by both), which the launcher shows while the cell runs. A loop that prints
    without end fills at most STREAM_CHARS of it; the rest comes with the answer."""

    def __init__(self, sink):
        super().__init__()
        self.sink = sink

    def write(self, text: str) -> int:
        n = super().write(text)
        sink = self.sink
        if sink is not None and sink["sent"] < STREAM_CHARS:
            part = text[:STREAM_CHARS - sink["sent"]]
            sink["sent"] += len(part)
            try:
                sink["file"].write(part + ("\n... (the rest of the output comes when the cell ends)\n"
                                          if sink["sent"] >= STREAM_CHARS else ""))
            except (OSError, ValueError):
                self.sink = None
        return n


class ReadyWatch:
    """Every gradient's ready time (its post-accumulate-grad hook), in ms since `start()`."""

    def __init__(self, model):
        from .probes.readiness import ReadyLog

        self.log = ReadyLog(model)
        self.start()

    def start(self) -> None:
        self.log.take()
        self.log.active = True
        self.t0 = clock.now_ns()

    def ready_ms(self) -> list[tuple[str, float]]:
        """(parameter name, ms after start) in the order the gradients became ready."""
        return [(e.param, round((e.t_ns - self.t0) / 1e6, 3)) for e in self.log.events]


class BucketWatch:
    """Every bucket DDP all-reduces (a pass-through communication hook), in ms since `start()`."""

    def __init__(self, ddp):
        from .probes.buckets import BucketLog

        self.log = BucketLog(ddp.process_group, {id(p): n for n, p in ddp.module.named_parameters()})
        ddp.register_comm_hook(None, self.log.hook)
        self.start()

    def start(self) -> None:
        self.log.events = []
        self.t0 = clock.now_ns()

    def buckets(self) -> list[dict]:
        """index, MiB, how many parameters, launch and done ms after start, in launch order."""
        return [{"index": e["index"], "MiB": round(e["bytes"] / 2**20, 4), "params": len(e["params"]),
                 "launch_ms": round((e["launch_ns"] - self.t0) / 1e6, 3),
                 "done_ms": round((e.get("done_ns", e["launch_ns"]) - self.t0) / 1e6, 3)} for e in self.log.events]


class Lab:
    """ddplab's probes for the code you type in `%%ddp` cells (the same ones its runs use)."""

    def memory(self, model, optimizer=None, buckets: BucketWatch | None = None) -> dict[str, float]:
        """MiB this rank holds now: parameters, gradients, DDP buckets (those a `watch_buckets` saw,
        not already counted as gradients), optimizer state (`rank/probes/memory.py`'s ledger)."""
        from .probes.memory import ledger

        no_optimizer = type("NoOptimizer", (), {"state": {}})()
        held = ledger(model, optimizer if optimizer is not None else no_optimizer,
                      list(buckets.log.buffers.values()) if buckets else [])
        return {k: round(v / 2**20, 4) for k, v in held.items() if k != "activations"}

    def watch_ready(self, model) -> ReadyWatch:
        """Start recording when each gradient of `model` becomes ready; `.ready_ms()` reads them."""
        return ReadyWatch(model)

    def watch_buckets(self, ddp) -> BucketWatch:
        """Record each bucket `ddp` (a DistributedDataParallel) all-reduces; `.buckets()` reads them.
        Call it before the first backward: DDP takes a communication hook only then."""
        return BucketWatch(ddp)


COLLECTIVES = frozenset({"all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor", "gather",
                         "scatter", "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single",
                         "barrier", "send", "recv", "all_gather_object", "broadcast_object_list"})


def _describe(args, kwargs) -> str | None:
    """'shape (4,) float32' of the first tensor a collective was handed (or of a list's first), else None."""
    import torch

    for a in (*args, *kwargs.values()):
        t = a[0] if isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor) else a
        if isinstance(t, torch.Tensor):
            return f"shape {tuple(t.shape)} {str(t.dtype).replace('torch.', '')}"
    return None


class TracedDist:
    """`dist` as a `%%ddp` cell sees it: torch.distributed, except that each collective first writes what
    it was called with (its name, the tensor's shape and dtype) to this rank's status file, and marks it
    done after (also when it raises). A cell that never finishes can then be explained: which collective
    a rank waits in, or that it waits in none called through `dist` (DDP's own collectives, direct
    torch.distributed calls and the wait on async work are not seen), and whether the ranks passed
    different sizes to one collective of one group."""

    def __init__(self, dist):
        self._dist, self.status = dist, None
        self.calls = 0   # collectives called through it in this cell: the status numbers them from 1 (#n)

    def __getattr__(self, name):
        f = getattr(self._dist, name)
        if name not in COLLECTIVES or not callable(f):
            return f

        @functools.wraps(f)
        def traced(*args, **kwargs):
            group = getattr(kwargs.get("group"), "group_name", None)   # the same on every rank of the group
            self.calls += 1
            call = {"op": name, "tensor": _describe(args, kwargs), "group": None if group is None else str(group),
                    "n": self.calls}
            self._write({**call, "done": False})
            raised = None
            try:   # (with async_op=True the call returns at once: the wait on its work is not seen)
                return f(*args, **kwargs)
            except BaseException as e:
                raised = type(e).__name__
                raise
            finally:
                self._write({**call, "done": True, "raised": raised})
        return traced

    def _write(self, d: dict) -> None:
        if self.status is not None:
            from ..rundir import write_json_atomic

            write_json_atomic(self.status, d)


def group_seqs() -> dict[str, int]:
    """Each process group's name -> how many collectives it has run (the sequence number torch's flight
    recorder gave its last), noted as a cell starts: a hung cell's collective is then numbered within the
    cell, not from the session's start-up barrier on (`witnesses.FlightVerdict`)."""
    try:
        from torch.distributed.distributed_c10d import _world

        groups = dict(_world.pg_names)
    except Exception:  # noqa: BLE001 - torch's private table: without it torch's own numbering is said
        return {}
    seqs = {}
    for pg, name in groups.items():
        try:
            seqs[str(name)] = int(pg._get_sequence_number_for_group())
        except Exception:  # noqa: BLE001 - (a backend without the count: that group keeps torch's numbering)
            pass
    return seqs


def namespace(env, device) -> dict:
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F

    return {"__name__": "__ddp_cell__", "rank": env.rank, "world_size": env.world_size,
            "local_rank": env.local_rank, "device": device, "torch": torch, "dist": TracedDist(dist), "nn": nn, "F": F,
            "lab": Lab()}


def run_cell(code: str, ns: dict, status=None, stream=None) -> dict:
    """Execute `code` in `ns` like a notebook cell: statements, then the last expression's value.
    Returns stdout, stderr, the value's repr (or None), the error (type, message, traceback) or None.
    `status`: the file where `dist`'s collectives say what they were called with (`TracedDist`);
    `stream`: the file what it prints goes to as it prints it (the launcher shows it live)."""
    if isinstance(ns.get("dist"), TracedDist):
        ns["dist"].status, ns["dist"].calls = status, 0
    sink = None
    if stream is not None:
        try:
            sink = {"file": open(stream, "a", buffering=1), "sent": 0}   # line-buffered: each line as it is printed
        except OSError:
            sink = None
    out, err = _Streamed(sink), _Streamed(sink)
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
    if sink is not None:
        sink["file"].close()
    return {"stdout": out.getvalue(), "stderr": err.getvalue(), "value": value, "error": error,
            "seconds": time.perf_counter() - t0}
