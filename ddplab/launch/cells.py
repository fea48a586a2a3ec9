"""The launcher's side of a `%%ddp` cell (`Session.execute`; the rank side is `rank/cells.py`): the
cell goes to the session's ranks as a job, and every rank's stdout, stderr, value and error come back.
While it runs, what the ranks printed shows with where each rank is (in which collective, for how long:
`where`). A hang, a dead rank, a timed-out collective or Ctrl-C tears the session down, the ranks'
testimonies taken first: a rank about to time out in a collective is asked while it still waits there.
A cell ends within the session's timeout plus CELL_GRACE_S, the testimonies and the teardown included;
`restart_later` then starts fresh ranks on a thread of their own, which the next cell waits for."""

from __future__ import annotations

import json
import threading
import time

from .. import failures, processes, rundir
from .torchrun import interrupts_caught

CELL_GRACE_S = 5.0   # beyond the default group's timeout: a cell's whole bound, testimonies and teardown included
KILL_RESERVE_S = 1.5   # of that grace, what is left for stopping the ranks once the wait for answers ends
ASK_LEAD_S = 1.0   # a rank this long before its collective times out is asked for its testimony while it waits
LIVE_S = 0.25   # how often what the ranks printed and where they are is read while the cell runs
STATE_S = 1.0   # and shown at least this often (the seconds each rank has waited)


class _Printed:
    """What each rank of cell `n` has printed so far (its stream file, `rank/cells.py`), read incrementally."""

    def __init__(self, directory, n: int, ranks):
        self.paths = {r: directory / f"job{n}.rank{r}.cell.stream" for r in ranks}
        self.text = {r: "" for r in ranks}
        self.offsets = {r: 0 for r in ranks}

    def poll(self) -> bool:
        moved = False
        for r, p in self.paths.items():
            try:
                with open(p, "rb") as f:
                    f.seek(self.offsets[r])
                    chunk = f.read()
            except OSError:
                continue
            if chunk:
                self.offsets[r] += len(chunk)
                self.text[r] += chunk.decode(errors="replace")
                moved = True
        return moved


class _States:
    """Where each rank of cell `n` is, as the launcher last read its files: rank -> {"state": "running",
    "collective" (with "op", "tensor" and "n": the cell's collective #n through `dist`) or "finished" (with
    "error": its error's type, or None), and "since": when the launcher first saw it so (time.monotonic)}."""

    def __init__(self, directory, n: int, ranks, t0: float):
        self.directory, self.n = directory, n
        self.now = {r: {"state": "running", "since": t0} for r in ranks}

    def poll(self, now: float) -> dict[int, dict]:
        for r, old in self.now.items():
            new = old if old["state"] == "finished" else self._read(r)
            if (new["state"], new.get("n")) != (old["state"], old.get("n")):
                self.now[r] = {**new, "since": now}
        return self.now

    def _read(self, r: int) -> dict:
        try:
            answer = json.loads((self.directory / f"job{self.n}.rank{r}.cell.json").read_text())
            return {"state": "finished", "error": (answer.get("error") or {}).get("type")}
        except (OSError, ValueError, AttributeError):
            pass
        try:
            st = json.loads((self.directory / f"job{self.n}.rank{r}.cell.status").read_text())
        except (OSError, ValueError):
            return {"state": "running"}
        if st.get("done"):
            return {"state": "running", "n": st.get("n")}
        return {"state": "collective", "op": st.get("op"), "tensor": st.get("tensor"), "n": st.get("n")}


def _in(st: dict) -> str:
    return f"dist.{st['op']} #{st['n']} ({st['tensor'] or 'no tensor'})"


def where(states: dict[int, dict], now: float) -> str:
    """Where each rank is, one clause per state ('rank 0: in dist.all_reduce #1 (shape (1,) float32) for 6 s;
    rank 1: finished the cell 6 s ago, waiting for the others'), the ranks in one state together."""
    by: dict[str, list[int]] = {}
    for r, st in sorted(states.items()):
        s = f"{now - st['since']:.0f} s"
        raised = f" (it raised {st['error']})" if st.get("error") else ""
        said = (f"in {_in(st)} for {s}" if st["state"] == "collective" else
                f"finished the cell {s} ago{raised}, waiting for the others" if st["state"] == "finished" else
                f"running the cell's own code for {s}")
        by.setdefault(said, []).append(r)
    return "; ".join(f"rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))}: {said}" for said, rs in by.items())


def running_note(states: dict[int, dict], now: float, t0: float, timeout_s: float) -> str:
    """The line under a running cell's table: where each rank is, and when the cell will be stopped."""
    return (f"running... {now - t0:.0f} s: {where(states, now)}. A collective times out after {timeout_s:g} s; "
            f"the cell is stopped by {timeout_s + CELL_GRACE_S:g} s")


def asked_where(st: dict | None, stack: str, now: float) -> str:
    """Where a rank was when the launcher asked for its testimony: from its stack (in the session's loop
    between jobs, `wait_for`: idle) and what the launcher last read of it (`_States`; None: not in the cell)."""
    idle = "in wait_for" in stack   # rank/session.py: its cell code had returned, or never ran on it
    if st is None:
        return "idle, between cells: it was not in this cell" if idle else "not in this cell"
    s = f"{now - st['since']:.0f} s"
    if st["state"] == "finished":
        raised = f", which raised {st['error']}" if st.get("error") else ""
        return f"{'idle, between cells: ' if idle else ''}it had finished this cell {s} before{raised}"
    if idle:
        return "idle, between cells"
    if st["state"] == "collective":
        return f"waiting in {_in(st)} for {s}: the other ranks had not joined it"
    return f"running the cell's own code for {s}, in no collective called through `dist` (its stack says where)"


def _about_to_fail(states: dict[int, dict], now: float, timeout_s: float) -> bool:
    """A rank has waited in a collective so long that it times out within ASK_LEAD_S."""
    return any(st["state"] == "collective" and now - st["since"] >= max(timeout_s - ASK_LEAD_S, timeout_s / 2)
               for st in states.values())


def run_cell(s, code: str, ranks: list[int] | None, live=None) -> dict[int, dict | None]:
    """`Session.execute`'s work, under its lock: write the cell as the session's next job, wait for every
    rank's answer (or the deadline, a dead rank, Ctrl-C), and tear the session down if the cell left the
    process group unusable. `live(printed, note)`, if given, is called with what each rank printed so far and
    a note saying where each rank is (`running_note`), every LIVE_S that something was printed and at least
    every STATE_S, and once more, with a note, if the cell is interrupted."""
    ranks = list(range(s.world_size)) if ranks is None else sorted(set(ranks))
    if s.alive() and not s.dir.exists():
        s._stop_for_lost_dir("")
    if not s.alive():
        raise RuntimeError("this session is closed: start a new one (%ddp_start)")
    bad = [r for r in ranks if not 0 <= r < s.world_size]
    if bad:
        raise ValueError(f"ranks: {bad} not in this session's 0..{s.world_size - 1}")
    n = s.jobs
    s.log_offset = (s.dir / rundir.LOG).stat().st_size
    rundir.write_json_atomic(s.dir / f"job{n}.json", {"cell": code, "ranks": ranks})
    s.jobs += 1
    s.cells += 1
    files = {r: s.dir / f"job{n}.rank{r}.cell.json" for r in ranks}
    t0 = time.monotonic()
    stop_at = t0 + s.timeout_s + CELL_GRACE_S   # the cell's bound: answers, testimonies and teardown
    deadline = stop_at - KILL_RESERVE_S
    ask_by = deadline - processes.WITNESS_WAIT_S - LIVE_S   # a cell still running then is asked before its end
    printed, states = _Printed(s.dir, n, ranks), _States(s.dir, n, ranks, t0)
    read_at = shown_at = t0
    asked = None   # (when, where each rank was then): the ranks were asked for their testimonies
    with interrupts_caught() as interrupted:
        while not interrupted and s.alive() and time.monotonic() < deadline and s.dir.exists():
            if all(f.exists() for f in files.values()):
                break
            time.sleep(s.poll_s)
            now = time.monotonic()
            if now - read_at < LIVE_S:
                continue
            read_at = now
            moved, seen = printed.poll(), states.poll(now)
            if asked is None and (_about_to_fail(seen, now, s.timeout_s) or now >= ask_by):
                asked = _ask(s, n, seen, now)   # while a rank still waits in its collective: its stack shows it there
            if live is not None and (moved or now - shown_at >= STATE_S):
                shown_at = now
                live(dict(printed.text), running_note(seen, now, t0, s.timeout_s) if now - t0 >= STATE_S else "")
        if interrupted and live is not None:   # what the ranks printed stays on the page
            printed.poll()
            live(dict(printed.text), "interrupted: the ranks were stopped")
        if not s.dir.exists():
            s._stop_for_lost_dir(" during the cell")
        s.died = "" if s.alive() else s.death()
        results = {r: (json.loads(f.read_text()) if f.exists() else None) for r, f in files.items()}
        s.cell_status = {}   # rank -> the last collective its `dist` was called for (rank/cells.py)
        for r in ranks:
            try:
                s.cell_status[r] = json.loads((s.dir / f"job{n}.rank{r}.cell.status").read_text())
            except (OSError, ValueError):
                pass
        lost = interrupted or any(v is None for v in results.values()) or any(
            v and v["error"] and failures.is_timeout(v["error"]) for v in results.values())
        s.cell_witness = None
        try:
            if lost and not interrupted and s.alive() and asked is None:   # torch's witnesses first
                now = time.monotonic()
                asked = _ask(s, n, states.poll(now), now)
            if lost and not interrupted and asked is not None:
                s.cell_witness = _testimony(s, n, asked)
        except Exception:  # noqa: BLE001 - a testimony that cannot be read must not keep the hung ranks alive
            s.cell_witness = None
        if lost:   # a hang, a dead rank or a timed-out collective leaves the process group unusable
            s.kill()
            s.forget(f"{s.died} during a %%ddp cell" if s.died else
                         "it was stopped after a %%ddp cell hung, timed out or was interrupted")
        else:
            s._arm_idle()
    if interrupted:
        raise failures.Interrupted(f"interrupted: the cell and the session's {s.world_size} ranks stopped")
    return results


def _ask(s, n: int, seen: dict[int, dict], now: float) -> tuple[float, dict]:
    """Ask every rank of the session for its testimony (`rank/witness.py`) about cell `n`; (when, where each
    rank of the cell was then, `_States`). A testimony that cannot be asked for is not asked for."""
    from .watch import collect

    try:
        progress, _, _ = collect(s.dir, s.world_size)   # the session's start-up records carry each rank's pid
        processes.ask_witnesses(processes.rank_processes({r: recs[-1] for r, recs in progress.items() if recs}),
                                lambda r: rundir.witness_file(s.dir, r, f"job{n}."))
    except Exception:  # noqa: BLE001 - the cell's own end must not wait on its witnesses
        pass
    return now, {r: dict(st) for r, st in seen.items()}


def _testimony(s, n: int, asked: tuple[float, dict]):
    """What the ranks' testimonies about cell `n` say, or None if no rank answered: (torch's flight-recorder
    analyzer's verdict, rank -> its stack, rank -> where it was when asked, `asked_where`)."""
    from .. import witnesses

    found = witnesses.testimony(s.dir, s.world_size, prefix=f"job{n}.")
    if found is None:
        return None
    verdict, stacks = found
    when, seen = asked
    return verdict, stacks, {r: asked_where(seen.get(r), stack, when) for r, stack in stacks.items()}


_restart: dict = {}   # the ranks restarting after a lost cell: {"thread": ..., "said": (restarted, what came of it)}


def restart_later(s) -> None:
    """Start `s`'s ranks afresh (the same settings) on a thread of their own, after a cell that left the
    process group unusable: the cell says its failure at once, and the next one waits (`restarted`)."""
    def restart() -> None:
        t0 = time.monotonic()
        try:
            new = type(s)(world_size=s.world_size, backend=s.backend, device=s.device, pin_cpus=s.pin_cpus,
                          timeout_s=s.timeout_s, runs_dir=s.dir.parent.parent)
            _restart["said"] = (True, f"{new.world_size} new ranks started in {time.monotonic() - t0:.1f} s")
        except Exception as e:  # noqa: BLE001 - said by the next cell, which then asks for %ddp_start
            _restart["said"] = (False, f"its ranks could not be restarted ({type(e).__name__}: {e})")

    restarted()   # (one restart at a time)
    _restart["thread"] = threading.Thread(target=restart, name="ddplab-cell-restart", daemon=True)
    _restart["thread"].start()


def restarted() -> tuple[bool, str] | None:
    """Wait for the restart `restart_later` began, if one is under way or unread: (whether the new ranks
    started, what came of it in a few words), else None."""
    thread = _restart.get("thread")
    if thread is None:
        return None
    thread.join()
    _restart.pop("thread", None)
    return _restart.pop("said", None)


def restart_finished() -> None:
    """Wait for ranks restarting after a lost cell (`restart_later`), leaving what came of it for the next
    cell: a launch meanwhile would share the cores with their start, or race it for the current session."""
    thread = _restart.get("thread")
    if thread is not None:
        thread.join()


def restarting() -> bool:
    """Are a lost cell's ranks restarting now (`restart_later`)?"""
    thread = _restart.get("thread")
    return thread is not None and thread.is_alive()
