"""`%load_ext ddplab`: type DDP code into a cell and watch every rank run it.

    %ddp_start -n 4              # a session of 4 warm torchrun ranks (ddplab.Session)
    %%ddp                        # this cell runs on every rank, state kept from cell to cell
    x = torch.tensor([rank + 1.0])
    dist.all_reduce(x)
    x                            # the last expression's value, per rank
    %%ddp --ranks 0              # a subset
    %ddp_stop

Each rank's namespace starts with `rank`, `world_size`, `local_rank`, `device`, `torch`, `dist`, `nn`,
`F` and `lab`, the lab's probes for your own loop (`lab.memory(model, opt)`, `lab.watch_ready(model)`,
`lab.watch_buckets(ddp)`; `rank/cells.py`). What each rank printed and its last value come back side by side, one
column per rank; an exception shows its rank and traceback in that rank's column and fails the cell.
After each cell, `_ddp` in the notebook is its `CellResult`: `_ddp.value(rank)` is the repr of that
rank's last expression, so a normal cell can check what the ranks answered.
A cell that hangs (say only rank 0 calls `all_reduce`) shows, while it waits, where each rank is (in
which collective, for how long) and when it will be stopped; it fails within the session's `--timeout`
plus 5 s, all said (`launch/cells.py`): the rank that never joined is named, each rank's stack folds out
under its column, and the session's ranks restart in the background (the next cell waits for them;
their variables are gone). The cell's `dist` notes each collective it is called for (name, shape,
dtype, #n from the cell's first), so the failure also says which collective a rank was waiting in, or
that it waited in none (its own code still running), and whether the ranks called one collective with
different sizes. Once a cell has run, `ddplab.run` launches cold rather than on this session: a cell
may have changed what a run depends on (default dtype, grad mode, global hooks).
"""

from __future__ import annotations

import html
import time

from .witnesses import LIBRARY


class CellFailed(Exception):
    """A `%%ddp` cell raised on some rank (or hung): one line in the notebook, the table says the rest."""

    def _render_traceback_(self) -> list[str]:
        return [f"CellFailed: {self}"]


class CellResult:
    """What every rank of a `%%ddp` cell left: rank -> {stdout, stderr, value, error} (None: it hung)."""

    def __init__(self, results: dict, seconds: float, died: str = "", status: dict | None = None, witness=None):
        self.results, self.seconds, self.died = results, seconds, died
        self.status = status or {}   # rank -> the last collective its `dist` was called for, and whether it ended
        # after a hang: (torch's flight-recorder verdict, rank -> its stack when asked, rank -> where that was)
        self.flight, self.stacks, self.asked = witness if witness else (None, {}, {})   # launch/cells.py

    @classmethod
    def running(cls, printed: dict, seconds: float, note: str = "") -> "CellResult":
        """What the ranks printed so far, shown while the cell runs (and kept if it is interrupted)."""
        shown = cls({r: {"stdout": text, "stderr": "", "value": None, "error": None} for r, text in printed.items()},
                    seconds)
        shown.note = note or "running..."
        return shown

    note = ""   # while the cell runs: "running...", or why it stopped

    def value(self, rank: int):
        r = self.results[rank]
        return None if r is None else r["value"]

    def stdout(self, rank: int) -> str:
        r = self.results[rank]
        return "" if r is None else r["stdout"]

    @property
    def failed(self) -> dict[int, str]:
        """rank -> a one-line reason, for every rank to blame: one that raised, one whose process died,
        one still in a collective, and, when others timed out waiting in a collective, one that
        finished the cell without joining it (as a cold run's hang diagnosis names the absent rank)."""
        from .failures import is_timeout

        out, timed_out, clean = {}, [], []
        unfinished = {r for r, res in self.results.items() if res is None or res["error"]}
        # among the ranks that did not finish the cell cleanly: the collective called through the cell's `dist`
        # that each was still in, or that raised
        waiting = {r: st for r, st in self.status.items()
                   if r in unfinished and (not st.get("done") or st.get("raised"))}
        for rank, r in sorted(self.results.items()):
            st = waiting.get(rank) if not (waiting.get(rank) or {}).get("done") else None
            nth = f" #{st['n']}" if st and "n" in st else ""   # the cell's collective #n through `dist`
            if r is None:
                out[rank] = (f"its process died: {self.died}" if self.died else
                             f"never finished: still waiting in dist.{st['op']}{nth} ({st['tensor'] or 'no tensor'}), "
                             f"a collective the other ranks did not join" if st else
                             "never finished, and not inside any collective called through the cell's `dist` "
                             "(DDP's own collectives and direct torch.distributed calls are not seen): its own code "
                             "may still have been running (a loop that does not end?)")
            elif r["error"] and is_timeout(r["error"]):
                timed_out.append(rank)
            elif r["error"]:
                out[rank] = f"{r['error']['type']}: {_plain(r['error']['message'])}".strip()
            else:
                clean.append(rank)
        if timed_out:
            waited = ", ".join(map(str, timed_out))
            for rank in clean:
                out[rank] = f"finished the cell without joining the collective rank(s) {waited} waited in"
            if not clean:
                for rank in timed_out:
                    out[rank] = f"{self.results[rank]['error']['type']}: {_plain(self.results[rank]['error']['message'])}"
        for op, group in {(st["op"], st.get("group")) for st in waiting.values() if st["op"] not in ("send", "recv")}:
            calls = {r: st["tensor"] for r, st in waiting.items() if (st["op"], st.get("group")) == (op, group)}
            if len(set(calls.values())) > 1:
                said = "; ".join(f"rank {r}: {t}" for r, t in sorted(calls.items()))
                for rank in calls:
                    out[rank] = (f"called dist.{op} with {calls[rank]}, and the ranks' calls differ ({said}): every "
                                 f"rank must pass the same shape and dtype, or the collective never matches up")
        return out

    def _cell(self, r) -> str:
        if r is None:
            return "<i>no answer: still running when the cell's time ran out</i>"
        parts = []
        text = r["stdout"] + r["stderr"]
        if text:
            parts.append(f"<pre style='margin:0'>{html.escape(text.rstrip())}</pre>")
        if r["value"] is not None:
            parts.append(f"<pre style='margin:0;color:#1a5fb4'>{html.escape(r['value'])}</pre>")
        if r["error"]:
            parts.append(f"<pre style='margin:0;color:#c01c28;{WRAP}'>{html.escape(folded(r['error']['traceback']))}</pre>")
        return "".join(parts) or "<i>(nothing)</i>"

    def _where(self, rank) -> str:
        st = self.stacks.get(rank)
        if not st:
            return ""
        said = f" ({html.escape(self.asked[rank])})" if self.asked.get(rank) else ""
        return (f"<details><summary>where rank {rank} was when the launcher asked{said}</summary>"
                f"<pre style='margin:0;{WRAP}'>{html.escape(st)}</pre></details>")

    def _repr_html_(self) -> str:
        ranks = sorted(self.results)
        head = "".join(f"<th style='text-align:left'>rank {r}</th>" for r in ranks)
        width = f"min-width:{max(12, 60 // max(1, len(ranks)))}em;max-width:{max(20, 100 // max(1, len(ranks)))}em"
        body = "".join(f"<td style='vertical-align:top;text-align:left;{width}'>{self._cell(self.results[r])}"
                       f"{self._where(r)}</td>" for r in ranks)
        flight = "".join(self._where(r) for r in sorted(self.stacks) if r not in self.results)   # ranks not in the cell
        flight += f"<br><small>{html.escape(str(self.flight))}</small>" if self.flight is not None else ""
        note = f" <b>{html.escape(self.note)}</b>" if self.note else ""
        return (f"<table class='ddplab-ddp-cell'><tr>{head}</tr><tr>{body}</tr></table>"
                f"<small>{len(ranks)} rank(s), {self.seconds * 1e3:.0f} ms</small>{note}{flight}")

    def __repr__(self) -> str:
        lines = []
        for rank in sorted(self.results):
            r = self.results[rank]
            lines.append(f"--- rank {rank} ---")
            if r is None:
                lines.append("(no answer: still running when the cell's time ran out)")
                continue
            if r["stdout"] + r["stderr"]:
                lines.append((r["stdout"] + r["stderr"]).rstrip())
            if r["value"] is not None:
                lines.append(f"-> {r['value']}")
            if r["error"]:
                lines.append(folded(r["error"]["traceback"]))
            if self.stacks.get(rank):
                said = f": {self.asked[rank]}" if self.asked.get(rank) else ""
                lines.append(f"(where rank {rank} was when the launcher asked{said})\n{self.stacks[rank]}")
        if self.flight is not None:
            lines.append(str(self.flight))
        return "\n".join(lines)


_LAST_START: dict = {}   # the last %ddp_start's settings, for "no session" messages
WRAP = "white-space:pre-wrap;overflow-wrap:anywhere"   # long lines wrap in their column, never widen it


def folded(traceback_text: str) -> str:
    """A rank's traceback as a learner reads it: the cell's own frames and the error in full; frames of
    torch, of the Python library and of the lab's own wrappers folded into a count; the error's message
    without gloo's C++ source location."""
    blocks, head = [], []
    for ln in traceback_text.rstrip().splitlines():
        if ln.lstrip().startswith('File "'):
            blocks.append([ln])
        elif blocks and ln.startswith("    "):
            blocks[-1].append(ln)   # a frame's code line and its ^^^ markers
        elif blocks:
            blocks.append([ln])     # the error (and chained tracebacks' own lines)
        else:
            head.append(ln)
    out, n = list(head), 0
    for b in blocks:
        frame = b[0].lstrip().startswith('File "')
        if frame and any(m in b[0] for m in (*LIBRARY, "/ddplab/")):   # and the lab's own wrappers
            n += 1
            continue
        if n:
            out.append(f"  ... {n} library frame(s)")
            n = 0
        out += b if frame else [_plain(x) for x in b]
    if n:
        out.append(f"  ... {n} library frame(s)")
    return "\n".join(out)


def _plain(message: str) -> str:
    """An error message without the C++ source location gloo puts first ('[/__w/.../pair.cc:553] ')."""
    import re

    return re.sub(r"\[[^\]\s]*\.(?:cc|cpp|h|hpp):\d+\]\s*", "", message)


def _grouped(failed: dict[int, str]) -> str:
    """One clause per distinct reason, naming every rank it holds for (not one per rank)."""
    by: dict[str, list[int]] = {}
    for r, why in sorted(failed.items()):
        by.setdefault(why, []).append(r)
    return "; ".join(f"rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))}: {why}" for why, rs in by.items())


def _parse_ranks(text: str | None):
    if not text:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--ranks: give rank numbers separated by commas, like 0,2 (got {text!r})") from None


def load(ip) -> None:
    from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
    from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
    from IPython.display import HTML, display

    from . import launch

    @magics_class
    class DDPMagics(Magics):
        @magic_arguments()
        @argument("-n", "--nproc", type=int, default=2, help="how many ranks (default 2)")
        @argument("--backend", default="auto", help="gloo, nccl or auto (default)")
        @argument("--device", default="auto", help="cpu, cuda or auto (default)")
        @argument("--timeout", type=float, default=30.0, help="seconds a collective may wait (default 30)")
        @line_magic
        def ddp_start(self, line):
            """Start a session of warm ranks for %%ddp cells (and for ddplab.run)."""
            args = parse_argstring(DDPMagics.ddp_start, line)
            _LAST_START["n"] = args.nproc
            launch.cells.restarted()   # ranks restarting after a hung cell are up before the new ones replace them
            t0 = time.monotonic()
            line = display(HTML(f"<small>starting {args.nproc} ranks: torchrun, then each rank imports torch and "
                                f"joins the process group (a few seconds)...</small>"), display_id=True)
            s = launch.session.Session(world_size=args.nproc, backend=args.backend, device=args.device,
                                       timeout_s=args.timeout,
                                       on_start=lambda text: line.update(HTML(f"<small>{html.escape(text)}</small>")))
            line.update(HTML(f"<pre style='margin:0'>{s.world_size} ranks ready on {s.backend}/{s.device} in "
                             f"{time.monotonic() - t0:.1f} s (collectives time out after {args.timeout:g} s)</pre>"))

        @line_magic
        def ddp_stop(self, line):
            """Stop the session's ranks."""
            launch.cells.restarted()   # (those restarting after a hung cell included)
            s = launch.session.current()
            if s is None:
                print("no session is running")
                return
            s.close()
            print(f"stopped {s.world_size} ranks" + (f", and {len(s.stopped)} process(es) the session's ranks started "
                                                       f"and left running: " + "; ".join(c[:120] for c in s.stopped)
                                                       if s.stopped else ""))

        @magic_arguments()
        @argument("--ranks", default=None, help="run on these ranks only, e.g. 0 or 0,2 (default: all)")
        @argument("--no-raise", action="store_true", help="say a failure without failing the cell (a demonstration: "
                                                           "Run All goes on)")
        @cell_magic
        def ddp(self, line, cell):
            """Run this cell on every rank of the session; show each rank's output side by side."""
            args = parse_argstring(DDPMagics.ddp, line)
            waiting = display(HTML("<small>waiting for the ranks the last cell's hang restarts...</small>"),
                              display_id=True) if launch.cells.restarting() else None
            restart = launch.cells.restarted()   # after a hung cell its ranks restart while its failure is read
            if waiting is not None and restart:
                waiting.update(HTML(f"<small>after the last cell's hang: {html.escape(restart[1])}</small>"))
            s = launch.session.current()
            if s is None or s.implicit:   # the session ddplab.run keeps is replaced at will: not for cell state
                why = (restart[1] if restart and not restart[0] else launch.session.last_end()) if s is None else None
                raise CellFailed(f"no session for %%ddp cells{f' (the last one ended: {why})' if why else ''}: "
                                 f"run %ddp_start -n {_LAST_START.get('n', 2)} first")
            t0 = time.monotonic()
            ranks = _parse_ranks(args.ranks)
            shown = display(HTML(f"<small>running on {len(ranks or range(s.world_size))} rank(s)...</small>"),
                            display_id=True)

            def live(printed: dict, note: str) -> None:   # what the ranks printed so far, while the cell runs
                shown.update(CellResult.running(printed, time.monotonic() - t0, note))

            answers = s.execute(cell, ranks, live=live)
            result = CellResult(answers, time.monotonic() - t0, died=s.died, status=s.cell_status,
                                witness=s.cell_witness)
            self.shell.user_ns["_ddp"] = result   # the notebook's own checks read the ranks' answers here
            shown.update(result)
            failed = result.failed
            if failed and s.died and all(why == f"its process died: {s.died}" for why in failed.values()):
                raise CellFailed(f"the session died during the cell: {s.died}. Every rank's state is gone: "
                                 f"%ddp_start again")
            if failed:
                what = _grouped(failed)
                if result.flight is not None and result.flight.ranks:
                    what += f". {result.flight}"
                if not s.alive():   # gloo cannot rebuild a process group a collective failed in
                    launch.cells.restart_later(s)
                    what += (f". The ranks were stopped (gloo cannot rebuild a process group a collective failed "
                             f"in), and {s.world_size} new ones are starting: the next %%ddp cell waits for them. Every "
                             f"rank's variables are gone: run the cells that set them up again")
                if args.no_raise:
                    import sys

                    print(f"CellFailed: {what}", file=sys.stderr)
                    return None
                raise CellFailed(what)
            return None

    ip.register_magics(DDPMagics)
