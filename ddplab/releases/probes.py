"""Probes of the running torch: each small function asks torch (its behaviour, or a signature) one
question a lesson rests on, and returns the answer; `ddplab.releases.FACTS` holds what each answered on the
releases CI verifies. The probes that need a process group make their own, on a file store or torch's fake
group, and destroy it: call them where no group is joined (a test, `ddplab doctor`, a notebook's kernel).
Used by `ddplab.releases`.
"""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path

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


@contextlib.contextmanager
def _own_group(probe: str, backend: str, world_size: int, store):
    """This process as rank 0 of its own process group for the probe's body, destroyed after it; refused
    where the process already joined one (a rank, a test that holds a group)."""
    import torch.distributed as dist

    if dist.is_initialized():
        raise RuntimeError(f"the {probe} probe makes its own process group: call it where none is joined")
    dist.init_process_group(backend, rank=0, world_size=world_size, store=store)
    try:
        yield
    finally:
        dist.destroy_process_group()


@functools.lru_cache(maxsize=1)
def _gloo_dump() -> dict:
    """The flight-recorder dump of a one-rank gloo process group of this process (made here, on a file
    store in a temporary folder, and destroyed again) after an all-reduce on it and one on a second group,
    with torch's default buffer size."""
    import json
    import os
    import tempfile

    import torch
    import torch.distributed as dist

    # torch's default, whatever this environment sets (a buffer size of 0 turns the recorder off)
    saved = {k: os.environ.pop(k) for k in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE") if k in os.environ}
    try:
        with tempfile.TemporaryDirectory() as folder, \
                _own_group("gloo", "gloo", 1, dist.FileStore(os.path.join(folder, "store"), 1)):
            dist.all_reduce(torch.ones(4))
            dist.all_reduce(torch.ones(4), group=dist.new_group([0]))
            return json.loads(torch._C._distributed_c10d._dump_fr_trace_json())
    finally:
        os.environ.update(saved)


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
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    from torch.testing._internal.distributed.fake_pg import FakeStore

    refusing = []
    with _own_group("schedule", "fake", 2, FakeStore()):
        stage = PipelineStage(torch.nn.Linear(2, 2), stage_index=0, num_stages=2, device=torch.device("cpu"))
        for schedule in (ScheduleGPipe, Schedule1F1B):
            try:
                schedule(stage, n_microbatches=1, loss_fn=lambda out, target: out.sum())
            except ValueError:
                refusing.append(schedule.__name__)
    return tuple(refusing)
