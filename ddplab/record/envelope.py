"""The rank record's envelope, and its writing and reading: the schema of `rank{r}.json`, shared by
the rank that writes it and the notebook that reads it (pure: no torch).

    {"schema_version": 2,
     "envelope": {rank, world_size, backend, device, pid, host, versions, spec_hash, launch_id, times},
     "result":   the task's own record: TrainRecord, AllReduceSweepRecord, BucketSweepRecord, ...}

Every event time is an integer number of nanoseconds since the launch's alignment barrier
(`rank/clock.py`: one time base for every rank, on one host or several); views turn it into
milliseconds after an origin of their choosing. A probe owns one
field of a step (`buckets`, `backward`, `write_bytes`, `activation_bytes`) or one section of the
task's record (`memory`, `reference`, `profile`). `dump` and `load` go through these definitions only, so a
file that does not match them is refused with the field that is wrong. Read through `results.Run`.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass

SCHEMA_VERSION = 2


@dataclass(frozen=True)
class Envelope:
    task: str
    rank: int
    local_rank: int
    world_size: int
    backend: str
    device: str
    pid: int
    host: str
    torch_version: str
    python: str
    spec_hash: str
    launch_id: str
    t_start_ns: int                # time.time_ns(): wall clock, for humans
    t_end_ns: int
    node: int = 0                  # torchrun's GROUP_RANK: the node (agent) the rank ran on
    aligned_at_ns: int = 0         # this host's raw monotonic clock at the alignment barrier (rank/clock.py)


@dataclass(frozen=True)
class RankRecord:
    envelope: Envelope
    result: object                 # the task's record class (`TaskSpec.record`)


def dump(rec: RankRecord) -> dict:
    """The JSON-ready dict of a rank record."""
    return {"schema_version": SCHEMA_VERSION, "envelope": dataclasses.asdict(rec.envelope),
            "result": dataclasses.asdict(rec.result)}


class RecordError(ValueError):
    """A rank file that does not match the schema; the message names the field."""


def load(d: dict, result_type: type) -> RankRecord:
    """Parse a rank file's dict into typed records; RecordError naming the first field that is wrong."""
    if not isinstance(d, dict):
        raise RecordError("is not a JSON object")
    if d.get("schema_version") != SCHEMA_VERSION:
        raise RecordError(f"has schema version {d.get('schema_version')}, expected {SCHEMA_VERSION}")
    for key in ("envelope", "result"):
        if key not in d:
            raise RecordError(f"lacks the field {key}")
    return RankRecord(parse(Envelope, d["envelope"], "envelope"), parse(result_type, d["result"], "result"))


def parse(tp, value, where: str):
    """`value` (from JSON) as type `tp`: dataclasses, list[X], dict[str, X], X | None, int, float, str."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        return parse(next(a for a in args if a is not type(None)), value, where)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise RecordError(f"{where}: expected an object, got {type(value).__name__}")
        hints = typing.get_type_hints(tp)
        fields = {f.name: f for f in dataclasses.fields(tp)}
        unknown = sorted(set(value) - set(fields))
        if unknown:
            raise RecordError(f"{where}: unknown field(s) {', '.join(unknown)}")
        kwargs = {}
        for name, f in fields.items():
            if name in value:
                kwargs[name] = parse(hints[name], value[name], f"{where}.{name}")
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise RecordError(f"{where}: lacks the field {name}")
        return tp(**kwargs)
    if origin is list:
        if not isinstance(value, list):
            raise RecordError(f"{where}: expected a list, got {type(value).__name__}")
        return [parse(args[0], v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise RecordError(f"{where}: expected an object, got {type(value).__name__}")
        return {k: parse(args[1], v, f"{where}.{k}") for k, v in value.items()}
    if tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if tp is object:
        return value
    if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
        raise RecordError(f"{where}: expected {tp.__name__}, got {value!r}")
    return value
