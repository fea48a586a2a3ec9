"""The launcher's side of a `%%ddp` cell (`Session.execute`; the rank side is `rank/cells.py`): the
cell goes to the session's ranks as a job, and every rank's stdout, stderr, value and error come back.
A hang, a dead rank, a timed-out collective or Ctrl-C tears the session down."""

from __future__ import annotations

import json
import time

from .. import failures, processes, rundir
from .torchrun import interrupts_caught

CELL_GRACE_S = 5.0   # beyond the default group's timeout, how long a cell may take before it counts as hung


LIVE_S = 0.25   # how often what the ranks printed is shown while the cell runs


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


def run_cell(s, code: str, ranks: list[int] | None, live=None) -> dict[int, dict | None]:
    """`Session.execute`'s work, under its lock: write the cell as the session's next job, wait for every
    rank's answer (or the deadline, a dead rank, Ctrl-C), and tear the session down if the cell left the
    process group unusable. `live(printed, note)`, if given, is called with what each rank printed so far,
    at most every LIVE_S while the cell runs, and once more, with a note, if it is interrupted."""
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
    deadline = time.monotonic() + s.timeout_s + CELL_GRACE_S
    printed, shown_at = _Printed(s.dir, n, ranks), time.monotonic()
    with interrupts_caught() as interrupted:
        while not interrupted and s.alive() and time.monotonic() < deadline and s.dir.exists():
            if all(f.exists() for f in files.values()):
                break
            time.sleep(s.poll_s)
            if live is not None and time.monotonic() - shown_at >= LIVE_S:
                shown_at = time.monotonic()
                if printed.poll():
                    live(dict(printed.text), "")
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
            if lost and not interrupted and s.alive():   # torch's witnesses first: the ranks' stacks and flight records
                s.cell_witness = _testimony(s, n)
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


def _testimony(s, n: int):
    """Ask every rank of the session for its testimony (`rank/witness.py`) about cell `n`, and read it:
    (torch's flight-recorder analyzer's verdict, rank -> where it was), or None if no rank answered."""
    from .. import witnesses
    from .watch import collect

    progress, _, _ = collect(s.dir, s.world_size)   # the session's start-up records carry each rank's pid
    processes.ask_witnesses(processes.rank_processes({r: recs[-1] for r, recs in progress.items() if recs}),
                            lambda r: rundir.witness_file(s.dir, r, f"job{n}."))
    return witnesses.testimony(s.dir, s.world_size, prefix=f"job{n}.")
