"""The checks a notebook runs on its own measurements: each says what it verified, or fails saying
what it expected and what it saw (pure: no torch, no pandas needed; a pandas Series works as a list).

    from ddplab import verify
    verify.equal("every rank is its own process", len({r.pid for r in run.ranks}), 4)
    verify.below("the DDP step is the batch-64 step, on every rank", ref["ddp_update_rel_error"], 1e-5)

prints one line per check that held,

    verified: every rank is its own process (seen 4, expected 4)
    verified: the DDP step is the batch-64 step, on every rank (seen at most 3.1e-08 over 4, expected < 1e-05)

and raises `CheckFailed` (an AssertionError) for one that did not:

    CheckFailed: NOT verified: the DDP step is the batch-64 step, on every rank: expected < 1e-05, seen 0.031 (the largest of 4)

Used by every notebook and exercise; `tests/views/test_verify.py` feeds each check a wrong value.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from .folded import Folded, show

__all__ = ["CheckFailed", "above", "between", "close", "equal", "below", "that"]


class CheckFailed(AssertionError):
    """A notebook's claim that its run contradicts: the message says expected versus seen."""

    def _render_traceback_(self) -> list[str]:   # IPython: the one line, not a traceback into ddplab
        return [f"CheckFailed: {self}"]


CUT = 400   # characters of a value a check prints at most


def fmt(v) -> str:
    """A value as a check prints it: floats to 3 significant digits, long lists cut after 8 entries, any
    value's text after `CUT` characters."""
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float):
        return f"{v:.3g}"
    if isinstance(v, (list, tuple)) and len(v) > 8:
        text = "[" + ", ".join(map(fmt, v[:8])) + f", ... ({len(v)} in all)]"
    elif isinstance(v, (list, tuple)):
        text = "[" + ", ".join(map(fmt, v)) + "]"
    else:
        text = str(v)
    return text if len(text) <= CUT else f"{text[:CUT]} ... ({len(text)} characters)"


_fmt = fmt


def _plain(v):
    """A numpy or torch scalar (or 0-d array) as a plain Python value; anything else unchanged."""
    return v.item() if hasattr(v, "item") and getattr(v, "ndim", 0) == 0 else v


def _values(seen) -> list:
    """A number, or every number of a list, tuple, array or pandas Series (as plain Python numbers)."""
    seen = _plain(seen)
    if isinstance(seen, (str, bytes, dict)) or not isinstance(seen, Iterable):
        return [seen]
    if hasattr(seen, "columns"):
        raise TypeError("verify takes one column (a Series) or a list, not a DataFrame")
    values = [_plain(v) for v in seen]
    if not values:
        raise CheckFailed("nothing to check: the values are empty")
    return values


def _not_finite(values: list) -> str | None:
    """'nan (value 2 of 3)' for the first value that is not a finite number, else None."""
    for i, v in enumerate(values):
        if not _finite(v):
            return _fmt(v) + (f" (value {i + 1} of {len(values)})" if len(values) > 1 else "")
    return None


LINE = 120   # a longer line shows the claim alone, what was seen and expected folded beneath it (Jupyter)


def _report(claim: str, ok: bool, seen: str, expected: str) -> None:
    if not ok:
        raise CheckFailed(f"NOT verified: {claim}: expected {expected}, seen {seen}")
    line = f"verified: {claim} (seen {seen}, expected {expected})"
    if len(line) <= LINE:
        print(line)
    else:
        show(Folded(f"verified: {claim}", f"seen {seen}\nexpected {expected}"), plain=line)


def that(claim: str, ok, seen=None, expected=None) -> None:
    """The claim holds when `ok` is true: a bool, or every element of a non-empty list, tuple,
    generator or pandas Series of bools; `seen` and `expected` say what was compared."""
    if not isinstance(ok, bool):
        ok = _plain(ok)
    if not isinstance(ok, bool):
        if hasattr(ok, "all") and hasattr(ok, "__len__"):
            ok = len(ok) > 0 and bool(ok.all())
        elif isinstance(ok, Iterable):
            items = list(ok)
            ok = bool(items) and all(items)
        else:
            ok = bool(ok)
    _report(claim, ok, "true" if seen is None and ok else ("false" if seen is None else _fmt(seen)),
            "true" if expected is None else _fmt(expected))


def listed(v):
    """A value as checks compare it: numpy and torch scalars as plain numbers, arrays, Series and tuples as
    lists; anything else unchanged."""
    v = _plain(v)
    if hasattr(v, "tolist"):
        return v.tolist()
    return list(v) if isinstance(v, tuple) else v


_listed = listed


def equal(claim: str, seen, expected) -> None:
    """seen == expected (lists, tuples, arrays and Series compare element by element, in order)."""
    seen, expected = _listed(seen), _listed(expected)
    _report(claim, seen == expected, _fmt(seen), _fmt(expected))


def _extreme(values: list, largest: bool, ok: bool) -> str:
    if len(values) == 1:
        return _fmt(values[0])
    worst = max(values) if largest else min(values)
    word = "largest" if largest else "smallest"
    return (f"at {'most' if largest else 'least'} {_fmt(worst)} over {len(values)}" if ok
            else f"{_fmt(worst)} (the {word} of {len(values)})")


def below(claim: str, seen, limit: float) -> None:
    """Every value of `seen` (one number or several) is < limit."""
    values = _values(seen)
    ok = all(_finite(v) and v < limit for v in values)
    _report(claim, ok, _not_finite(values) or _extreme(values, True, ok), f"< {_fmt(limit)}")


def above(claim: str, seen, limit: float) -> None:
    """Every value of `seen` (one number or several) is > limit."""
    values = _values(seen)
    ok = all(_finite(v) and v > limit for v in values)
    _report(claim, ok, _not_finite(values) or _extreme(values, False, ok), f"> {_fmt(limit)}")


def between(claim: str, seen, low: float, high: float) -> None:
    """Every value of `seen` is within [low, high]."""
    values = _values(seen)
    ok = all(_finite(v) and low <= v <= high for v in values)
    shown = _not_finite(values) or (_fmt(values[0]) if len(values) == 1 else f"{_fmt(min(values))} to {_fmt(max(values))}")
    _report(claim, ok, shown, f"within [{_fmt(low)}, {_fmt(high)}]")


def close(claim: str, seen, expected, rel: float = 1e-6, abs_: float = 0.0) -> None:
    """seen matches expected within |seen - expected| <= abs_ + rel * |expected|, element by element."""
    a, b = _values(seen), _values(expected)
    if len(a) != len(b):
        raise CheckFailed(f"NOT verified: {claim}: expected {len(b)} values, seen {len(a)}")
    excess = [abs(x - y) - rel * abs(y) - abs_ for x, y in zip(a, b)]
    ok = all(_finite(x) and e <= 0 for x, e in zip(a, excess))
    tolerance = f" within {_fmt(rel)} relative" + (f" + {_fmt(abs_)}" if abs_ else "")
    if ok:
        deviation = max(abs(x - y) / abs(y) if y else abs(x - y) for x, y in zip(a, b))
        error = ("relative error" if all(b) else "absolute error" if not any(b)
                 else "error (relative where nonzero was due)")
        seen_s = f"{_fmt(a[0])}, {error} {_fmt(deviation)}" if len(a) == 1 else \
            f"{error} at most {_fmt(deviation)} over {len(a)}"
    else:
        worst = max(range(len(a)), key=lambda i: excess[i] if _finite(excess[i]) else math.inf)
        seen_s = _fmt(a[0]) if len(a) == 1 else f"{_fmt(a[worst])} where {_fmt(b[worst])} was due (the worst of {len(a)})"
    _report(claim, ok, seen_s, (_fmt(b[0]) if len(b) == 1 else f"{len(b)} values") + tolerance)


def _finite(v) -> bool:
    try:
        return math.isfinite(v)
    except (TypeError, OverflowError):
        return False
