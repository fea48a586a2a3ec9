"""What a check of the exercise says: one `Finding` per check, a `Report` of them (a table in a notebook),
and `EvidenceFailed`, the one-line error nbgrader's test cells raise. Pure: no torch, no runs."""

from __future__ import annotations

import html
from dataclasses import dataclass

PIECES = ("batch", "memory", "gradients", "readiness", "buckets", "comm")


@dataclass
class Finding:
    """One check: `ok` True (held), False (failed) or None (the piece is not filled in yet)."""

    piece: str
    check: str
    ok: bool | None
    message: str


class EvidenceFailed(AssertionError):
    """Some evidence did not pass: one line a learner can act on, not a traceback into ddplab."""

    def _render_traceback_(self) -> list[str]:
        return [f"EvidenceFailed: {self}"]


class Report:
    """Every finding of one `check`; shows as a table in a notebook."""

    def __init__(self, findings: list[Finding], seconds: float = 0.0):
        self.findings, self.seconds = findings, seconds

    def of(self, *pieces: str) -> list[Finding]:
        return [f for f in self.findings if not pieces or f.piece in pieces]

    def passed(self, *pieces: str) -> bool:
        found = self.of(*pieces)
        return bool(found) and all(f.ok for f in found)

    def failures(self, *pieces: str) -> list[Finding]:
        return [f for f in self.of(*pieces) if not f.ok]

    def assert_passed(self, *pieces: str) -> None:
        """Raise EvidenceFailed naming every check of `pieces` (default: all) that did not hold."""
        unknown = [p for p in pieces if p not in PIECES]
        if unknown:
            raise ValueError(f"pieces: {unknown} are not pieces of the evidence ({', '.join(PIECES)})")
        bad = self.failures(*pieces)
        if bad:
            raise EvidenceFailed("; ".join(f"{f.piece}: {f.message}" for f in bad))

    def _repr_html_(self) -> str:
        mark = {True: "<b style='color:#26a269'>ok</b>", False: "<b style='color:#c01c28'>FAIL</b>",
                None: "<b style='color:#9a6700'>todo</b>"}   # words, not emoji: every font has them
        rows = "".join(f"<tr><td>{mark[f.ok]}</td><td>{f.piece}</td><td style='text-align:left'>{html.escape(f.check)}</td>"
                       f"<td style='text-align:left'>{html.escape(f.message)}</td></tr>" for f in self.findings)
        held = sum(1 for f in self.findings if f.ok)
        return (f"<table class='ddplab-exercise'><tr><th></th><th>piece</th><th>check</th><th>feedback</th></tr>{rows}"
                f"</table><small>{held} of {len(self.findings)} checks hold ({self.seconds:.1f} s)</small>")

    def __repr__(self) -> str:
        mark = {True: "ok  ", False: "FAIL", None: "todo"}
        return "\n".join(f"{mark[f.ok]} {f.piece}: {f.check}: {f.message}" for f in self.findings)
