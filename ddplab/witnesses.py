"""torch's own witnesses of a failed or hung run, beside ddplab's diagnosis: each rank's testimony
(`rank/witness.py`: its Python stacks and torch's flight recorder, written as JSON when it failed or when
the launcher asked) and torch's flight-recorder analyzer run over them.

    testimonies = witnesses.read(run_dir, world_size)
    verdict = witnesses.flight_verdict(testimonies, world_size)   # which collective, which rank, per torch
    witnesses.verify_same_rank(diagnosis.ranks, verdict)          # ddplab and torch name the same rank(s)

Every file is read as JSON data and checked before use. torch's analyzer reads its dumps with pickle
(`torch/distributed/flight_recorder/components/loader.py`, code run on load) and passes a group's rank list through
`eval` when it is a string (`builder.py`), so the lab never hands it a file: it builds the analyzer's
input from checked JSON, with group tables it writes itself. Found on torch 2.13 with gloo:
ProcessGroupGloo records every collective (state "scheduled", never "completed"); the dump's group
table holds one row keyed "" (rank list "[0, 1]", or "[]" once other groups exist) while the entries
name their groups "0", "2", ..., on which the analyzer fails with KeyError ('0', 0): the groups are
rebuilt from the entries (`_groups`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from . import verify
from .rundir import witness_file

MAX_BYTES = 32 * 2 ** 20   # a testimony larger than this is not read
LIBRARY = ("site-packages", "dist-packages", "/lib/python3", "<frozen ")   # where a frame is not the learner's


def read(directory, world_size: int, prefix: str = "") -> dict[int, dict]:
    """rank -> its testimony (`rank/witness.py`), for the ranks that left a well-formed one."""
    out = {}
    for rank in range(world_size):
        path = witness_file(Path(directory), rank, prefix)
        try:
            if path.stat().st_size > MAX_BYTES:
                continue
            data = json.loads(path.read_text())
        except (OSError, ValueError, RecursionError):   # (nesting deep enough to exhaust the parser's stack)
            continue
        if isinstance(data, dict) and data.get("rank") == rank and isinstance(data.get("stacks"), dict):
            out[rank] = data
    return out


def _groups(entries: dict[int, list[dict]], world_size: int) -> dict:
    """The process groups the records use, as torch's analyzer wants them ({name: {"desc", "name", "ranks"}}),
    built from the entries, not from the dump's own table: on torch 2.13 with gloo that table holds one row
    keyed "" (its rank list sometimes "[]") whatever groups the process made. The default group ("0") holds
    every rank; another group, the ranks that recorded a collective in it. Rank lists are written here from
    integers, never copied from a file."""
    members: dict[tuple[str, str], set[int]] = {}
    for rank, es in entries.items():
        for e in es:
            members.setdefault(tuple(e["process_group"]), set()).add(rank)
    return {name: {"desc": desc, "name": name,
                   "ranks": str(list(range(world_size)) if name == "0" else sorted(ranks))}
            for (name, desc), ranks in members.items()}


def _entries(raw) -> list[dict] | None:
    if not isinstance(raw, list):
        return None
    keep = []
    for e in raw:
        pg = e.get("process_group") if isinstance(e, dict) else None
        if not (isinstance(pg, list) and len(pg) == 2 and all(isinstance(x, str) for x in pg)
                and isinstance(e.get("collective_seq_id"), int) and isinstance(e.get("record_id"), int)
                and isinstance(e.get("profiling_name"), str)):
            return None
        keep.append(e)
    return keep


@dataclass
class FlightVerdict:
    """What torch's analyzer found in the ranks' flight records: the first collective not every rank
    joined or that the ranks called differently (its sequence number in its group, its name), and the
    rank(s) it names; `said`: the analyzer's own words. `ranks` is empty when it found nothing to blame,
    and `why_not` then says why (no records, ranks without a record, the analyzer's error)."""

    dumps: list[int]
    seq: int | None = None
    collective: str = ""
    group: str = ""
    ranks: list[int] = field(default_factory=list)
    how: str = ""            # "missing" (never joined) or "mismatch" (called another collective or size)
    said: str = ""
    why_not: str = ""
    earlier: int | None = None   # a `%%ddp` cell's: how many collectives of `group` came before the cell

    def __str__(self) -> str:
        if not self.ranks:
            return f"torch's flight recorder analyzer names no rank: {self.why_not}"
        who = ", ".join(map(str, self.ranks))
        head = f"torch's flight recorder analyzer (records of rank(s) {', '.join(map(str, self.dumps))}): rank(s) {who}"
        which, note = self._which()
        if self.how == "missing":
            return f"{head} never joined {which} ({self.collective}{f'; {note}' if note else ''})"
        return f"{head} called something other than the lowest rank's {self.collective} at {which}" + (
            f" ({note})" if note else "")

    def _which(self) -> tuple[str, str]:
        """('collective #1 of this cell in group 0:default_pg', what torch's own number counts), or torch's
        number alone where the cell's start is unknown: torch numbers a group's collectives from its creation,
        and a session's default group began with the session's start-up barrier (`rank/session.py`)."""
        if self.earlier is None or self.seq is None or self.seq <= self.earlier:
            return f"collective #{self.seq} of group {self.group}", ""
        if self.earlier == 0:   # a group the cell made
            return f"collective #{self.seq} of this cell in group {self.group}", ""
        before = ("the session's start-up barrier" + (f" and {self.earlier - 1} collective(s) of earlier cells"
                                                      if self.earlier > 1 else "")
                  if self.group.split(":")[0] == "0" else f"{self.earlier} collective(s) of earlier cells")
        return (f"collective #{self.seq - self.earlier} of this cell in group {self.group}",
                f"torch's flight recorder numbers it #{self.seq}, after {before}")


def flight_verdict(testimonies: dict[int, dict], world_size: int) -> FlightVerdict:
    """torch's analyzer (`torch.distributed.flight_recorder`) over the ranks' flight records."""
    kept, version, skipped = {}, None, []
    for rank, t in sorted(testimonies.items()):
        fl = t.get("flight") if isinstance(t.get("flight"), dict) else {}
        entries = _entries(fl.get("entries"))
        if entries is None or not isinstance(fl.get("version"), str):
            skipped.append(f"rank {rank}: {fl.get('error') or 'no flight record in its testimony'}")
            continue
        version, kept[rank] = fl["version"], entries
    groups = _groups(kept, world_size)   # (the dump's own group table is not read: see _groups)
    details = {f"rank{r}": {"host_name": f"host_rank{r}", "rank": r, "entries": es, "version": version,
                            "pg_config": groups} for r, es in kept.items()}
    dumps = sorted(d["rank"] for d in details.values())
    absent = [r for r in range(world_size) if r not in testimonies]
    if not details:
        return FlightVerdict(dumps, why_not="no rank left a flight record" + (f" ({'; '.join(skipped)})" if skipped else ""))
    db, said = _analyze(details, version)
    if isinstance(db, Exception):
        return FlightVerdict(dumps, why_not=f"its analysis failed: {type(db).__name__}: {db}", said=said)
    for c in db.collectives:
        missing = sorted(c.missing_ranks or ())
        # torch's "culprits": the ranks whose call differs from the reference rank's (the lowest rank with a
        # record left to match), whose call `collective_name` is; with two ranks that is a convention
        mismatched = sorted(c.mismatch_collectives or ())
        if missing or mismatched:
            return FlightVerdict(dumps, c.collective_seq_id, c.collective_name, c.pg_desc, missing or mismatched,
                                 "missing" if missing else "mismatch", said)
        if not c.pass_check:
            return FlightVerdict(dumps, c.collective_seq_id, c.collective_name, c.pg_desc, said=said,
                                 why_not=f"it found collective #{c.collective_seq_id} wrong without naming a rank "
                                         f"(an all_to_all whose sizes do not add up?)")
    gone = f"; rank(s) {', '.join(map(str, absent))} left no testimony (killed before they could be asked?)" if absent else ""
    empty = [r for r, es in kept.items() if not es]
    blank = (f"; rank(s) {', '.join(map(str, empty))} recorded no collective at all, which the analyzer takes for a "
             f"missing record" if empty else "")
    return FlightVerdict(dumps, said=said,
                         why_not=f"every collective it could match, every rank with a record joined{gone}{blank}")


def _analyze(details: dict, version: str):
    """torch's own analyzer, its log captured: (Database or the exception it raised, its words)."""
    from torch.distributed.flight_recorder.components.fr_logger import FlightRecorderLogger

    FlightRecorderLogger()   # its logger and handler exist from here: the analyzer's words are kept, not printed
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    log = logging.getLogger("Flight Recorder")
    saved = (list(log.handlers), log.propagate, log.level)
    for h in saved[0]:
        log.removeHandler(h)
    keep = Keep()
    log.addHandler(keep)
    log.propagate, log.level = False, logging.INFO
    try:
        from torch.distributed.flight_recorder.components.builder import build_db
        from torch.distributed.flight_recorder.components.config_manager import JobConfig

        args = JobConfig().parse_args(["-", "--allow-incomplete-ranks"])
        try:
            db = build_db(details, args, version)
        except Exception as e:  # noqa: BLE001 - the analyzer's failure is reported, not raised
            db = e
    finally:
        log.removeHandler(keep)
        for h in saved[0]:
            log.addHandler(h)
        log.propagate, log.level = saved[1], saved[2]
    return db, "\n".join(ln for ln in lines if ln.strip() and "tabulate" not in ln)


def testimony(directory, world_size: int, prefix: str = "") -> tuple[FlightVerdict, dict[int, str]] | None:
    """What the ranks' testimonies in `directory` say, or None where none was left: torch's analyzer's
    verdict, and where each rank the launcher asked was (rank -> `stack`)."""
    testimonies = read(directory, world_size, prefix)
    if not testimonies:
        return None
    verdict = flight_verdict(testimonies, world_size)
    verdict.earlier = _earlier(testimonies, verdict.group)
    return verdict, {
        r: stack(t) for r, t in sorted(testimonies.items())
        if t.get("why") == "asked" and isinstance(t.get("stacks"), dict) and t["stacks"].get("MainThread")}


def _earlier(testimonies: dict[int, dict], group: str) -> int | None:
    """How many collectives of `group` ("name:desc") came before the `%%ddp` cell the testimonies are about,
    as every rank noted when the cell began (`rank/witness.py`; a group made in the cell: 0), or None: not a
    cell's testimonies, or the ranks' counts differ."""
    name = group.split(":")[0]
    noted = {t["seqs_at_start"].get(name, 0) for t in testimonies.values() if isinstance(t.get("seqs_at_start"), dict)}
    return noted.pop() if len(noted) == 1 and all(type(x) is int for x in noted) else None


def verify_same_rank(ddplab_ranks, verdict: FlightVerdict) -> str:
    """ddplab's diagnosis and torch's analyzer name the same rank(s); raises `verify.CheckFailed` when
    they differ, and says so (without failing) when torch's records cannot name any."""
    if not verdict.ranks:
        return f"not compared: {verdict}"
    verify.equal("the rank(s) ddplab blames = the rank(s) torch's flight recorder analyzer names",
                 sorted(ddplab_ranks), sorted(verdict.ranks))
    return f"ddplab and torch's analyzer name the same rank(s): {', '.join(map(str, verdict.ranks))}"


def stack(testimony: dict, thread: str = "MainThread", shown: int = 6) -> str:
    """One thread's stack as a learner reads it: the frames of their code (outside the Python library and
    site-packages) in full, innermost last; library frames folded into a count, except the innermost
    (where it waits)."""
    stacks = testimony.get("stacks") if isinstance(testimony.get("stacks"), dict) else {}
    frames = [f for f in (stacks.get(thread) or []) if isinstance(f, dict)] if isinstance(stacks.get(thread), list) else []
    if not frames:
        return f"(no stack of {thread}: its testimony was written by the failing thread itself; its traceback says where)"
    out, folded = [], 0
    for i, f in enumerate(frames):
        library = any(m in str(f.get("file", "")) for m in LIBRARY)
        if library and i != len(frames) - 1:
            folded += 1
            continue
        if folded:
            out.append(f"  ... {folded} library frame(s)")
            folded = 0
        out.append(f"  {Path(str(f.get('file'))).name}:{f.get('line')} in {f.get('function')}: {str(f.get('code', ''))[:100]}")
    return "\n".join(out[-shown * 2:])


__all__ = ["FlightVerdict", "flight_verdict", "read", "stack", "testimony", "verify_same_rank"]
