"""The small validators every spec section uses: a ValueError that names the field (pure).
Used by every spec section, so by every notebook.
"""

from __future__ import annotations

import math


def bad(field_name: str, why: str):
    raise ValueError(f"Experiment.{field_name}: {why}")


def is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v) -> bool:
    """A finite int or float (not a bool, not inf or nan, not an int too large for a float)."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:
        return False
