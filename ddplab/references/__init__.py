"""Reference runs: a stored verdict of each timing claim from a real run that resolved it, shown beside the
same claim where a learner's run cannot resolve it (`ddplab.claims.check`), labelled as not this run.

`bench/reference_runs.py` makes them on a quiet machine and stores them in `claims.json` beside this file
(plain JSON, read as data), each with its machine, load, links, date and commit. Claims are matched by
their text with every number inside parentheses blanked (`claim_key`). A reference never decides
anything: the outcome is the learner's run's.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

__all__ = ["REFERENCES", "claim_key", "reference", "reference_source", "stored"]

REFERENCES = Path(__file__).with_name("claims.json")
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?")


def claim_key(claim: str) -> str:
    """A claim's text with every number inside parentheses blanked (where claims quote this run's
    measurements): the same claim in another run has the same key, while the numbers that name what
    is claimed (a rank, a plan such as ddp:64, a stage count) stay and keep different claims apart. A
    trailing bracket is left out: it counts a family's members ("[the weakest of 13 pairs: 12 hold, ...]"),
    which change from run to run while the claim stays the same."""
    claim = re.sub(r"\s*\[[^\[\]]*\]\s*$", "", claim)
    out, depth, start = [], 0, 0
    for i, ch in enumerate(claim + "("):
        if ch in "()":
            part = claim[start:i]
            out.append(_NUMBER.sub("#", part) if depth > 0 else part)
            if i < len(claim):
                out.append(ch)
            depth = max(0, depth + (1 if ch == "(" else -1))
            start = i + 1
    return " ".join("".join(out).split())


@functools.lru_cache(maxsize=4)
def _references(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) and isinstance(data.get("claims"), dict) else {}


def _entry(claim: str, path: Path | None) -> tuple[dict, dict] | None:
    data = _references(path or REFERENCES)
    entry = data.get("claims", {}).get(claim_key(claim))
    run = data.get("runs", {}).get(str(entry.get("run"))) if isinstance(entry, dict) else None
    return (entry, run) if isinstance(run, dict) else None


def stored(claim: str, path: Path | None = None) -> dict:
    """A stored reference run's verdict of `claim`: its outcome, what it saw and its date; {} where none."""
    found = _entry(claim, path)
    if not found:
        return {}
    entry, run = found
    return {"outcome": entry.get("outcome", "?"), "seen": entry.get("seen") or _seen_in(str(entry.get("line", ""))),
            "date": run.get("date", "?")}


def reference(claim: str, path: Path | None = None) -> str:
    """A stored reference run's verdict of `claim` in one line, labelled as not this run (its answer, what
    it saw, its date), or "" where none is stored; `reference_source` says where it ran."""
    ref = stored(claim, path)
    if not ref:
        return ""
    return (f"a reference run (not this run, {ref['date']}) resolved it: {ref['outcome']}"
            + (f" (seen {ref['seen']})" if ref["seen"] else ""))


def reference_source(claim: str, path: Path | None = None) -> str:
    """Where and how `claim`'s reference run ran: machine, load, links, commit, the script that made it."""
    found = _entry(claim, path)
    if not found:
        return ""
    run = found[1]
    links = "; ".join(sorted(set(str(x) for x in run.get("links", {}).values()))) or "loopback"
    return (f"{run.get('machine', '?')}, load {run.get('load', '?')}, {links}, {run.get('date', '?')}, commit "
            f"{run.get('commit', '?')} (bench/reference_runs.py)")


_OLD_SEEN = re.compile(r"\((?:median (?:of|over) \d+ [^,]*?|estimate \(standard error [^)]*\)) "
                       r"([-+][\d.e+-]+(?: ms| us| s| GB/s| MiB)?), [\d.]+% interval")


def _seen_in(line: str) -> str:
    """What a stored verdict line saw: "seen X" of a one-line verdict, or the median of a line written
    before the statistics were folded ("(median of 14 values +0.252, 99.8% interval ...")."""
    m = re.search(r"\(seen ([^;)]+)", line) or _OLD_SEEN.search(line)
    return m.group(1) if m else ""
