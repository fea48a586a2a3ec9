"""Each epoch's order, as a sampler hands it out to the DataLoader.

A watched sampler's class becomes a subclass of its own (same name, so `isinstance` and every
attribute stay as they were) whose `__iter__` records the pass: its epoch, a digest of its order, and
on the first pass what a DistributedSampler pads or drops. Which guard hears of it, and the sampler's
last order, live in a table beside the sampler (weakly keyed), not on it: a copy or a pickle of the
sampler is the plain sampler.
"""

from __future__ import annotations

import hashlib
import weakref
from array import array
from collections.abc import Sized

_WATCHED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # sampler -> {"guard", "last", "passes"}


def _plain(cls, state: dict):
    obj = cls.__new__(cls)
    obj.__dict__.update(state)
    return obj


def watch(sampler, guard) -> None:
    """Send `sampler`'s passes to `guard` (from now on; watching it again moves it to another guard)."""
    if not isinstance(sampler, Sized):
        raise ValueError(f"sampler: the guard reads a whole epoch's order, so the sampler needs a length; "
                         f"{type(sampler).__name__} has none")
    entry = _WATCHED.setdefault(sampler, {"last": None, "passes": 0})
    entry["guard"] = guard
    cls = type(sampler)
    if getattr(cls, "_ddplab_watched", False):
        return

    def __iter__(s):
        order = list(cls.__iter__(s))
        _new_pass(s, order)
        return iter(order)

    def __reduce_ex__(s, protocol):
        return _plain, (cls, dict(vars(s)))

    sampler.__class__ = type(cls.__name__, (cls,), {"__iter__": __iter__, "__reduce_ex__": __reduce_ex__,
                                                    "__module__": cls.__module__, "__qualname__": cls.__qualname__,
                                                    "_ddplab_watched": True})


def _digest(order: list) -> str:
    try:
        raw = array("q", [int(i) for i in order]).tobytes()
    except (TypeError, ValueError, OverflowError):   # a batch sampler's lists, or other items
        raw = repr(order).encode()
    return hashlib.sha1(raw).hexdigest()


def _new_pass(sampler, order: list) -> None:
    entry = _WATCHED.get(sampler)
    if entry is None:
        return
    digest, first = _digest(order), entry["last"] is None
    event = {"epoch": getattr(sampler, "epoch", None), "pass": entry["passes"], "n": len(order), "first": first,
             "repeats": (not first and digest == entry["last"] and len(order) > 1
                         and bool(getattr(sampler, "shuffle", True))), "padded": 0, "dropped": 0}
    if first and hasattr(sampler, "total_size") and hasattr(sampler, "dataset"):
        size = len(sampler.dataset)
        event["padded" if sampler.total_size >= size else "dropped"] = abs(sampler.total_size - size)
    entry["last"], entry["passes"] = digest, entry["passes"] + 1
    entry["guard"].sampler_events.append(event)
