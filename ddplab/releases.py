"""Which torch releases the lab is verified on, and the facts about torch's internals that differ
between them, each read from the running torch.

The lab teaches torch's own mechanisms, so what it says about them can change with a release. Each
`Fact` here is a probe: a small function that asks the running torch (its behaviour, or a signature),
never a remembered answer. `VERIFIED` is what CI checks (the whole suite on each); `expected` holds what
each fact was on each verified release. `ddplab doctor` prints the running release and every fact that
behaves differently from the newest verified release; the tests (`tests/test_releases.py`) fail when a
fact on the running torch is not what it was on its release, or, on a newer release, what it was on the
newest verified one. docs/torch-versions.md says what each fact means for a learner.
Used by `ddplab doctor`, `import ddplab` (the oldest release) and notebooks 08 and 09.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

VERIFIED = ("2.13.0", "2.14.1")   # the releases CI runs the whole suite on (.ci/run)
OLDEST = VERIFIED[0]


def release(version: str) -> tuple[int, ...]:
    """"2.14.1+cu130" -> (2, 14, 1); "2.15.0a0" -> (2, 15, 0): the release, without its build labels."""
    found = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    if not found:
        raise ValueError(f"torch version {version!r}: expected major.minor[.patch]")
    return tuple(int(n or 0) for n in found.groups())


def installed_torch() -> str | None:
    """The torch release installed where ddplab runs, read from its package metadata (no import)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return None


def require_supported(found: str | None) -> None:
    """ImportError, said plainly, when torch is missing or older than the oldest verified release: a
    lesson would otherwise stop at a traceback from deep inside torch."""
    fix = f"pip install 'torch>={OLDEST}' (verified: {', '.join(VERIFIED)})"
    if found is None:
        raise ImportError(f"ddplab needs torch, which is not installed here: {fix}")
    if release(found) < release(OLDEST):
        raise ImportError(f"ddplab needs torch >= {OLDEST}; this environment has torch {found}: {fix}")


# ---- the facts, each a probe of the running torch ------------------------------------------------------
def analyzer_evaluates_rank_lists() -> bool:
    """Does torch's flight-recorder analyzer run a group's rank list as Python (`eval`) when it reads a
    dump? Probed with a harmless expression that only `eval` accepts."""
    import logging

    from torch.distributed.flight_recorder.components.fr_logger import FlightRecorderLogger

    log = FlightRecorderLogger().logger
    level = log.level
    log.setLevel(logging.ERROR)   # importing the builder warns that the optional `tabulate` is missing
    try:
        from torch.distributed.flight_recorder.components.builder import build_groups_memberships
    finally:
        log.setLevel(level)
    # the dump's rank list as a quoted string: torch reads it with literal_eval, then reads a string again
    table = {0: {"g": {"name": "g", "desc": "probe", "ranks": repr("list(range(2))")}}}
    try:
        build_groups_memberships(table)
    except (ValueError, SyntaxError):   # ast.literal_eval refuses an expression
        return False
    return True


def local_group_name_counts() -> str:
    """What torch counts into the name of a group made with `use_local_synchronization` (whose members
    meet in the store under that name): "groups held" (groups this process holds now) or "groups made"
    (new_group calls this process has made, in members and in non-members alike). Probed without a
    process group: the name changes with exactly one of the two counters."""
    from torch.distributed import distributed_c10d as c10d

    world = c10d._world
    before = c10d._hash_ranks_to_str([0, 1])
    world.group_count += 1
    try:
        counts_made = c10d._hash_ranks_to_str([0, 1]) != before
    finally:
        world.group_count -= 1
    return "groups made" if counts_made else "groups held"


@functools.lru_cache(maxsize=1)
def _gloo_dump() -> dict:
    """The flight-recorder dump of a one-rank gloo process group of this process (made here, on a file
    store in a temporary folder, and destroyed again) after an all-reduce on it and one on a second group."""
    import json
    import os
    import tempfile

    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        raise RuntimeError("the gloo probe makes its own process group: call it where none is joined")
    with tempfile.TemporaryDirectory() as folder:
        dist.init_process_group("gloo", rank=0, world_size=1, store=dist.FileStore(os.path.join(folder, "store"), 1))
        try:
            dist.all_reduce(torch.ones(4))
            dist.all_reduce(torch.ones(4), group=dist.new_group([0]))
            return json.loads(torch._C._distributed_c10d._dump_fr_trace_json())
        finally:
            dist.destroy_process_group()


def gloo_flight_record_states() -> tuple[str, ...]:
    """The states of a gloo rank's flight-record entries after two all-reduces (none: gloo records nothing
    by default)."""
    return tuple(sorted({e["state"] for e in _gloo_dump().get("entries", [])}))


def gloo_dump_group_table() -> dict:
    """A gloo rank's dump's own group table (key -> rank list) once the rank made a second group: what
    torch's analyzer would read, and why the lab writes its own from the entries (`ddplab/witnesses.py`)."""
    return {key: row.get("ranks") for key, row in _gloo_dump().get("pg_config", {}).items()}


def ddp_bucket_caps_mib() -> tuple[float, float]:
    """DDP's buckets by default: (the first bucket's cap, every other bucket's cap), in MiB."""
    import torch.distributed as dist
    from torch.nn.parallel import distributed

    return dist._DEFAULT_FIRST_BUCKET_BYTES / 2**20, float(distributed._DEFAULT_BUCKET_CAP_MB)


def ddp_bucket_rule() -> list[list[int]]:
    """torch's own assignment of parameters to buckets (the Reducer's `compute_bucket_assignment_by_size`)
    for six 1 KiB float32 tensors under the caps [2 KiB, 3 KiB]: which tensors share a bucket. A bucket
    closes once it reaches its cap; the first cap serves the first bucket, the last one every later bucket."""
    import torch
    import torch.distributed as dist

    tensors = [torch.empty(256) for _ in range(6)]
    buckets, _ = dist._compute_bucket_assignment_by_size(tensors, [2048, 3072])
    return [list(b) for b in buckets]


def ddp_takes_bucket_cap_mb_list() -> bool:
    """Does DDP's constructor take `bucket_cap_mb_list` (one cap per bucket)?"""
    import inspect

    from torch.nn.parallel import DistributedDataParallel

    return "bucket_cap_mb_list" in inspect.signature(DistributedDataParallel.__init__).parameters


def optimize_ddp_modes() -> tuple[str, tuple[str, ...]]:
    """torch.compile's DDP modes: (the mode that `optimize_ddp`'s default setting means, every mode it takes)."""
    from torch._dynamo import config, utils

    with config.patch(optimize_ddp=config._config["optimize_ddp"].default):   # its default, whatever is set now
        return utils.get_optimize_ddp_mode(), tuple(utils._ddp_optimization_mode)


def ddp_buffer_sync_setting() -> str:
    """The name of DDP's constructor setting that copies rank 0's buffers before each forward."""
    import inspect

    from torch.nn.parallel import DistributedDataParallel

    takes = inspect.signature(DistributedDataParallel.__init__).parameters
    return "forward_sync_buffers" if "forward_sync_buffers" in takes else "broadcast_buffers"


def batched_powersgd_takes_one_matrix() -> bool:
    """Does PowerSGD's orthogonalization accept the one 2-D matrix that torch's `batched_powerSGD_hook`
    hands it? (False: the batched hook fails at its first compressed step, so the lab leaves it out.)"""
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    try:
        powerSGD_hook._orthogonalize(torch.zeros(16, 2))
    except AssertionError:
        return False
    return True


def dcp_metadata_format() -> str:
    """The format of the `.metadata` file a distributed checkpoint (DCP) writes: "pickle" means loading a
    checkpoint unpickles it (what `ddplab/seal.py` guards against), anything else names what it is."""
    import tempfile
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp

    with tempfile.TemporaryDirectory() as folder, warnings.catch_warnings():
        warnings.simplefilter("ignore")   # no process group: DCP says it saves as one process
        dcp.save({"w": torch.zeros(2)}, checkpoint_id=folder, no_dist=True)
        head = (Path(folder) / ".metadata").read_bytes()[:2]
    return "pickle" if head[:1] == b"\x80" else f"not pickle ({head!r})"


def schedules_refusing_fewer_microbatches_than_stages() -> tuple[str, ...]:
    """Which of torch's pipeline schedules (GPipe, 1F1B) refuse fewer microbatches than stages: asked of
    torch's own classes, for stage 0 of 2, on the fake process group (one process, no communication)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("the schedule probe makes its own process group: call it where none is joined")
    dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    refusing = []
    try:
        stage = PipelineStage(torch.nn.Linear(2, 2), stage_index=0, num_stages=2, device=torch.device("cpu"))
        for schedule in (ScheduleGPipe, Schedule1F1B):
            try:
                schedule(stage, n_microbatches=1, loss_fn=lambda out, target: out.sum())
            except ValueError:
                refusing.append(schedule.__name__)
    finally:
        dist.destroy_process_group()
    return tuple(refusing)


@dataclass(frozen=True)
class Fact:
    name: str
    says: str                       # what the probe answers, for a learner
    probe: Callable[[], object]
    expected: dict                  # verified release -> the probe's answer there
    plain: dict | None = None       # answer -> the sentence a notebook prints (else `says: answer`)


FACTS = (
    Fact("analyzer_evaluates_rank_lists",
         "torch's flight-recorder analyzer runs a dump's rank list as Python (eval)",
         analyzer_evaluates_rank_lists, {"2.13.0": True, "2.14.1": False},
         {True: "its flight-recorder analyzer runs a dump's rank list as Python (eval): a dump can run code",
          False: "its flight-recorder analyzer reads a dump's rank list as a literal (ast.literal_eval), "
                 "never as code"}),
    Fact("gloo_flight_record_states", "a gloo rank's flight-record entries after two all-reduces are in states",
         gloo_flight_record_states, {v: ("scheduled",) for v in VERIFIED},
         {("scheduled",): "gloo records every collective in its flight recorder, by default, and every entry "
                          "stays 'scheduled' (gloo never marks one started or completed)",
          (): "gloo records nothing in the flight recorder by default"}),
    Fact("gloo_dump_group_table", "a gloo rank's dump's group table, once a second group exists, is",
         gloo_dump_group_table, {"2.13.0": {"": "[]"}, "2.14.1": {"": "[0]"}}),
    Fact("local_group_name_counts",
         "a group made with use_local_synchronization is named after how many",
         local_group_name_counts, {"2.13.0": "groups held", "2.14.1": "groups made"}),
    Fact("ddp_bucket_caps_mib", "DDP's default bucket caps in MiB (first bucket, the others)",
         ddp_bucket_caps_mib, {"2.13.0": (1.0, 25.0), "2.14.1": (1.0, 25.0)}),
    Fact("ddp_bucket_rule", "torch's bucket assignment of six 1 KiB tensors under caps of 2 and 3 KiB",
         ddp_bucket_rule, {"2.13.0": [[0, 1], [2, 3, 4], [5]], "2.14.1": [[0, 1], [2, 3, 4], [5]]}),
    Fact("ddp_takes_bucket_cap_mb_list", "DDP takes one cap per bucket (bucket_cap_mb_list)",
         ddp_takes_bucket_cap_mb_list, {"2.13.0": True, "2.14.1": True}),
    Fact("optimize_ddp_modes", "torch.compile's DDP modes (the default's meaning, all of them)",
         optimize_ddp_modes,
         {v: ("ddp_optimizer", ("ddp_optimizer", "python_reducer", "python_reducer_without_compiled_forward",
                                "no_optimization")) for v in VERIFIED}),
    Fact("ddp_buffer_sync_setting", "DDP's setting that syncs buffers before each forward is named",
         ddp_buffer_sync_setting, {"2.13.0": "forward_sync_buffers", "2.14.1": "forward_sync_buffers"}),
    Fact("batched_powersgd_takes_one_matrix", "PowerSGD's orthogonalization takes the batched hook's 2-D matrix",
         batched_powersgd_takes_one_matrix, {"2.13.0": False, "2.14.1": False}),
    Fact("schedules_refusing_fewer_microbatches_than_stages",
         "torch's pipeline schedules that refuse fewer microbatches than stages",
         schedules_refusing_fewer_microbatches_than_stages, {v: ("Schedule1F1B",) for v in VERIFIED}),
    Fact("dcp_metadata_format", "a distributed checkpoint's .metadata file is written as",
         dcp_metadata_format, {"2.13.0": "pickle", "2.14.1": "pickle"}),
)


def fact(name: str):
    """The running torch's answer to the fact called `name`."""
    return next(f for f in FACTS if f.name == name).probe()


def tell(name: str) -> str:
    """The fact called `name` on the running torch, in one plain sentence."""
    import torch

    f = next(f for f in FACTS if f.name == name)
    answer = f.probe()
    said = f.plain[answer] if f.plain and answer in f.plain else f"{f.says}: {answer!r}"
    return f"torch {torch.__version__}: {said}"


def baseline(found: str) -> str:
    """The verified release whose answers the running torch should give: its own where it is verified,
    else the newest verified release older than it (or the oldest, for an older one)."""
    older = [v for v in VERIFIED if release(v) <= release(found)]
    return older[-1] if older else OLDEST


@dataclass(frozen=True)
class Answer:
    fact: Fact
    seen: object
    expected: object    # on `baseline`'s release

    @property
    def differs(self) -> bool:
        return self.seen != self.expected


def answers(found: str) -> list[Answer]:
    """Every fact on the running torch beside what it was on `baseline(found)`."""
    base = baseline(found)
    return [Answer(f, f.probe(), f.expected[base]) for f in FACTS]


def report(found: str) -> list[str]:
    """`ddplab doctor`'s lines about the running release: verified or not, and each fact that differs from
    a verified release (from `baseline`; the others, where this is a verified release)."""
    base = baseline(found)
    verified = release(found) in {release(v) for v in VERIFIED}
    lines = [f"torch {found}: " + ("verified (CI runs the whole suite on it)" if verified else
                                   f"not verified (CI checks {', '.join(VERIFIED)}); compared with {base}")]
    for a in answers(found):
        others = {v: e for v, e in a.fact.expected.items() if e != a.seen}
        if a.differs:
            lines.append(f"  DIFFERS from {base}: {a.fact.says}: {a.seen!r} here, {a.expected!r} on {base}")
        elif others:
            lines.append(f"  {a.fact.says}: {a.seen!r} here (as on {base}; "
                         + ", ".join(f"{e!r} on {v}" for v, e in others.items()) + ")")
    return lines
