"""The small validators every spec section uses: a ValueError that names the field (pure).
Used by every spec section, so by every notebook.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math

_READING = contextvars.ContextVar("ddplab_reading_a_record", default=False)


@contextlib.contextmanager
def reading_a_record():
    """Inside: specs are rebuilt from a finished run's spec.json (`results.load_run`). Only the spec's own
    fields are checked, never what it pointed to when it was launched (a resume's saving run may have
    moved or gone since; the checkpoint was checked before the ranks read it)."""
    token = _READING.set(True)
    try:
        yield
    finally:
        _READING.reset(token)


def reading() -> bool:
    return _READING.get()


def bad(field_name: str, why: str):
    raise ValueError(f"Experiment.{field_name}: {why}")


def is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def int_in(field_name: str, v, low: int, high: int) -> None:
    """`v` must be an integer in low..high; a ValueError naming the field otherwise."""
    if not is_int(v) or not low <= v <= high:
        bad(field_name, f"must be an integer in {low}..{high} (got {v!r})")


def same_work_on_every_rank(exp, what: str) -> None:
    """A task that compares arms needs one local_batch and one seq_len for every rank."""
    if any(isinstance(v, tuple) for v in (exp.local_batch, exp.seq_len)):
        bad("local_batch", f"{what} gives every rank the same work: one local_batch and one seq_len")


def is_number(v) -> bool:
    """A finite int or float (not a bool, not inf or nan, not an int too large for a float)."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


def only_fields(cls, d, what: str) -> dict:
    """`d`, when it is a dict of the dataclass `cls`'s fields (a spec read from JSON); else a ValueError that
    says what `d` should be, or names the fields `cls` does not have."""
    if not isinstance(d, dict):
        raise ValueError(f"{what} is a JSON object of {cls.__name__} fields (got {type(d).__name__})")
    unknown = sorted(set(d) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
        raise ValueError(f"unknown {cls.__name__} field(s): {', '.join(unknown)}")
    return d
