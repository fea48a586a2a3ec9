"""Reading a learner's evidence: the documented structure, or a `Malformed` naming the field. Plain
Python numbers, numpy scalars and values read off a DataFrame are all accepted. The notebook's
templates hold `...` where a value goes; a value still `...` is not filled in yet (`placeholders`)."""

from __future__ import annotations

import math
import numbers


class Malformed(Exception):
    """A piece whose structure is not the documented one: its message names the field."""


def fields(ev, where: str, keys: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict:
    """`ev` as a dict holding every one of `keys`, or a Malformed that lists them all at once (the
    missing ones, and any other keys written instead). `optional` keys may be left out."""
    expected = ", ".join(repr(k) for k in keys + optional)
    if not isinstance(ev, dict):
        got = repr(ev) if len(repr(ev)) <= 60 else f"{repr(ev)[:57]}..."
        key = "keys" if len(keys + optional) > 1 else "key"
        raise Malformed(f"{where}: a dict with the {key} {expected} (the template in the notebook), got {got}")
    missing = [k for k in keys if ev.get(k) is None]
    if missing:
        others = ", ".join(repr(k) for k in ev if k not in keys + optional)
        raise Malformed(f"{where}: missing {', '.join(repr(k) for k in missing)}; it needs every key of {expected}"
                        + (f" (you wrote {others}, which it does not read)" if others else ""))
    return ev


def placeholders(v, where: str) -> list[str]:
    """Where `v` still holds the template's `...`: the paths, in order."""
    if v is Ellipsis:
        return [where]
    if isinstance(v, dict):
        return [p for k, x in v.items() for p in placeholders(x, f"{where}[{k!r}]")]
    if isinstance(v, (list, tuple)):
        return [p for i, x in enumerate(v) for p in placeholders(x, f"{where}[{i}]")]
    return []


def leaves(v) -> int:
    """How many values `v` holds (a dict's or list's, counted through)."""
    if isinstance(v, dict):
        return sum(leaves(x) for x in v.values())
    if isinstance(v, (list, tuple)):
        return sum(leaves(x) for x in v)
    return 1


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
