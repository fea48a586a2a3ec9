"""Units and the one time base, shared by every stage (pure: no torch).

MiB and KiB are powers of 1024. Every event a rank records (a gradient ready, a bucket launched or
done, backward's start and end) is an integer number of nanoseconds on the rank's monotonic clock,
counted from the launch's alignment barrier (`rank/clock.py`), so events of different ranks compare
directly, on one host or across hosts (docs/ddp-internals.md, "Clocks"). Views turn them into
milliseconds after some origin with `ms_after`.
Used by every stage, so by every notebook.
"""

from __future__ import annotations

MIB = 2 ** 20
KIB = 2 ** 10
DTYPE_BYTES = {"float32": 4, "float64": 8}


def ms_after(t_ns: int, origin_ns: int) -> float:
    """Milliseconds from `origin_ns` to `t_ns` on the ranks' shared time base."""
    return (t_ns - origin_ns) / 1e6


def rel_error(predicted: float, measured: float) -> float:
    """(predicted - measured) / measured: the sign says which way the prediction misses."""
    return (predicted - measured) / measured


def size_label(n: int, digits: int = 6) -> str:
    """4096 -> '4 KiB'; 3 * 2**20 -> '3 MiB'; 12 -> '12 B'; at most `digits` significant digits where
    the unit allows (size_label(1802334, digits=3) -> '1.72 MiB'; 1023 KiB in 3 digits -> '0.999 MiB')."""
    units = (("MiB", MIB), ("KiB", KIB), ("B", 1))
    for i, (unit, scale) in enumerate(units):
        if n >= scale or scale == 1:
            if i and round(n / scale) >= 10 ** digits:   # too many digits before the point: the larger unit
                unit, scale = units[i - 1]
            value = n / scale
            return f"{value:.{digits}g} {unit}" if value < 10 ** digits else f"{value:.0f} {unit}"
