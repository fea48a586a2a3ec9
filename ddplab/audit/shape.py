"""Reading a learner's evidence: the documented structure, or a `Malformed` naming the field. Plain
Python numbers, numpy scalars and values read off a DataFrame are all accepted."""

from __future__ import annotations

import math
import numbers


class Malformed(Exception):
    """A piece whose structure is not the documented one: its message names the field."""


def get(ev, key: str, piece: str):
    if not isinstance(ev, dict) or key not in ev or ev[key] is None:
        raise Malformed(f"{piece}[{key!r}] is missing (see the description of this piece)")
    return ev[key]


def number(v, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(float(v)):
        raise Malformed(f"{where}: expected a number, got {v!r}")
    return float(v)


def integer(v, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or float(v) != int(v):
        raise Malformed(f"{where}: expected a whole number, got {v!r}")
    return int(v)


def numbers_list(v, where: str, n: int | None = None) -> list[float]:
    if isinstance(v, (str, bytes, dict)) or not hasattr(v, "__iter__"):
        raise Malformed(f"{where}: expected a list of numbers, got {v!r}")
    out = [number(x, f"{where}[{i}]") for i, x in enumerate(v)]
    if n is not None and len(out) != n:
        raise Malformed(f"{where}: one value per rank ({n}), got {len(out)}")
    return out


def batches(v, where: str, world_size: int) -> list[int]:
    """One local batch per rank; a single number means the same on every rank (as in an Experiment)."""
    if isinstance(v, numbers.Real) and not isinstance(v, bool):
        v = [v] * world_size
    if isinstance(v, (str, bytes, dict)) or not hasattr(v, "__iter__"):
        raise Malformed(f"{where}: one positive whole number per rank, got {v!r}")
    out = [integer(x, f"{where}[{i}]") for i, x in enumerate(v)]
    if len(out) != world_size or min(out) < 1:
        raise Malformed(f"{where}: one positive whole number per rank ({world_size} of them), got {out}")
    return out


def by_rank(v, where: str) -> dict[int, object]:
    """{rank: row} with int or numeric-string keys ("0"), as a dict or a list of rows."""
    if isinstance(v, list):
        v = dict(enumerate(v))
    if not isinstance(v, dict):
        raise Malformed(f"{where}: expected {{rank: ...}}, got {type(v).__name__}")
    out = {}
    for k, row in v.items():
        try:
            out[int(k)] = row
        except (TypeError, ValueError):
            raise Malformed(f"{where}: keys are rank numbers (0, 1, ...), got {k!r}") from None
    return out
