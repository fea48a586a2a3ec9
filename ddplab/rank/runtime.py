"""Where a rank runs: its identity from torchrun's environment, its device, setup and teardown, and
the clock that times a step's phases. The backend choice is `host.choose_backend`, shared with the
launcher. `teardown` holds the fix for the gloo exit-time SIGABRT
(docs/ddp-internals.md, "Teardown at exit"): drop every object that references the process group, collect,
destroy the group; the worker then leaves with `os._exit` so no interpreter finalization can race
gloo's threads.
Used by every notebook's runs.
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass
from datetime import timedelta

from . import clock


@dataclass(frozen=True)
class RankEnv:
    rank: int
    local_rank: int
    world_size: int
    node: int = 0              # torchrun's GROUP_RANK: which node (agent) this rank runs on
    local_world_size: int = 0  # ranks of this node (0: world_size)
    agent: int = 0             # which of the agents on this host started it (`launch.nodes` runs several)
    agents_here: int = 1

    @property
    def ranks_here(self) -> int:
        """Ranks on this host: its GPUs and cores are shared among them."""
        return (self.local_world_size or self.world_size) * self.agents_here

    @property
    def slot(self) -> int:
        """This rank's place among the ranks on this host: its GPU, and its core when pinned."""
        return self.agent * (self.local_world_size or self.world_size) + self.local_rank


def rank_env() -> RankEnv:
    """This process's rank, local rank, world size and node as torchrun set them, and its agent on
    this host as `launch.nodes` set it (simulated nodes share one host's GPUs and cores)."""
    env = os.environ
    return RankEnv(int(env["RANK"]), int(env["LOCAL_RANK"]), int(env["WORLD_SIZE"]), int(env.get("GROUP_RANK", 0)),
                   int(env.get("LOCAL_WORLD_SIZE", env["WORLD_SIZE"])), int(env.get("DDPLAB_AGENT", 0)),
                   int(env.get("DDPLAB_AGENTS_HERE", 1)))


def cores() -> list[int] | None:
    """The CPU cores this process may run on, sorted (after `pin_to_core`, its one core); None where
    the OS cannot say (no `os.sched_getaffinity`). Records name them so views can tell ranks that
    shared a core."""
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None


def pin_to_core(slot: int) -> None:
    """Run this rank (and the threads it starts later, gloo's included) on one core, its slot on this host mod
    the cores available: fewer migrations, steadier timings (docs/performance-anchors.md, "Pinning ranks
    to cores")."""
    if hasattr(os, "sched_setaffinity"):
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[slot % len(cores)]})


def setup(backend: str, device_type: str, env: RankEnv, timeout_s: float):
    """Join the process group; return the torch.device this rank computes on."""
    import torch
    import torch.distributed as dist

    if device_type == "cuda":
        device = torch.device("cuda", env.slot % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    # the timeout bounds every collective: a rank waiting for a peer that never comes raises after it
    kwargs = {"device_id": device} if backend == "nccl" else {}
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s), **kwargs)
    return device


def subgroups(world_sizes: list[int], world_size: int, timeout_s: float, fresh: bool = False) -> dict:
    """One process group per distinct experiment world size w, over ranks 0..w-1 (None = all ranks,
    unless `fresh`: a session's job gets new groups of every size, with its own timeout), each bounded
    by `timeout_s` like the default group. `new_group` is itself collective: every rank creates every
    group, in the same order."""
    import torch.distributed as dist

    groups = {}
    for w in world_sizes:
        if w not in groups:
            groups[w] = None if w == world_size and not fresh else \
                dist.new_group(list(range(w)), timeout=timedelta(seconds=timeout_s))
    return groups


_MESHES: dict = {}   # (device type, world size, dims) -> DeviceMesh: one per process, as torch expects


def meshes(exps: list, device_type: str, timeout_s: float) -> dict:
    """experiment index -> the torch `DeviceMesh` its task asks for (`mesh_dims`), over its ranks
    0..world_size-1 with the task's dimension names, its groups bounded by `timeout_s`.
    Every rank of the launch builds every mesh, in the experiments' order, before any experiment runs:
    torch makes a mesh's groups with `new_group`, which every rank of the default group must call, also
    the ranks outside a narrower experiment's mesh (they get a mesh without a coordinate). Each rank
    making only its own groups (`use_local_synchronization`) names them after what that rank made
    before, which torch 2.14 counts differently from 2.13 (docs/torch-versions.md).
    A mesh is built once per process and kept: torch takes two meshes of the same layout and names for
    the same mesh (DTensor caches its plans by mesh), so a session's later job gets the mesh an earlier
    job built, with this job's timeout."""
    import torch
    from torch.distributed.device_mesh import DeviceMesh

    built = {}
    for i, exp in enumerate(exps):
        dims = exp.task.mesh_dims(exp)
        if not dims:
            continue
        key = (device_type, exp.world_size, tuple(dims))
        if key not in _MESHES:
            names, sizes = zip(*dims)
            layout = torch.arange(exp.world_size, dtype=torch.int).view(*sizes)
            _MESHES[key] = DeviceMesh(device_type, layout, mesh_dim_names=names,
                                      backend_override=tuple((None, _group_options(timeout_s)) for _ in dims))
        if _MESHES[key].get_coordinate() is not None:   # a rank outside the mesh holds none of its groups
            for group in _MESHES[key].get_all_groups():
                group.set_timeout(timedelta(seconds=timeout_s))
        built[i] = _MESHES[key]
    return built


def _group_options(timeout_s: float):
    """Options for new groups of the default group's backend, bounded by `timeout_s`: one object a
    group (torch writes a group's own ranks and name into the options it is given)."""
    import torch.distributed as dist

    options = dist.ProcessGroupNCCL.Options() if dist.get_backend() == "nccl" else dist.ProcessGroupGloo._Options()
    options._timeout = timedelta(seconds=timeout_s)
    return options


def extra_groups(exps: list, timeout_s: float) -> dict:
    """experiment index -> the groups its task uses besides its own (`extra_groups`), in the task's order
    (`GroupMember.NON_GROUP_MEMBER` on a rank outside one), each bounded by `timeout_s`. Made by every
    rank of the launch, in the experiments' order, as `subgroups` are: then every process has made the
    same groups in the same order, and torch gives every later group the same name on every rank."""
    import torch.distributed as dist

    asked = {i: exp.task.extra_groups(exp) for i, exp in enumerate(exps)}
    return {i: [dist.new_group(list(ranks), timeout=timedelta(seconds=timeout_s), backend=backend)
                for ranks, backend in groups]
            for i, groups in asked.items() if groups}


def destroy_groups(groups: dict, extra: dict | None = None) -> None:
    """Destroy the groups `subgroups` and `extra_groups` made (a session's job is over; the default group
    and the meshes stay)."""
    import torch.distributed as dist

    gc.collect()
    for g in [*groups.values(), *(g for made in (extra or {}).values() for g in made)]:
        if g is not None and g != dist.GroupMember.NON_GROUP_MEMBER:
            dist.destroy_process_group(g)


def teardown() -> None:
    """Collect, then destroy the process group. Call it after the DDP model and optimizer are gone
    (the worker keeps them inside a function that has returned), or gloo threads outlive the group."""
    import torch.distributed as dist

    _MESHES.clear()
    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()


class Clock:
    """Per-phase wall time of a step: perf_counter on CPU, CUDA events on a GPU."""

    def __init__(self, device):
        import torch

        self.cuda = device.type == "cuda"
        self._torch = torch
        self.marks: list[tuple[str, object]] = []

    def mark(self, name: str) -> None:
        if self.cuda:
            ev = self._torch.cuda.Event(enable_timing=True)
            ev.record()
            self.marks.append((name, ev))
        else:
            self.marks.append((name, clock.now_ns()))

    def durations_ms(self) -> dict[str, float]:
        """Milliseconds between consecutive marks, summed by the later mark's name; clears the marks."""
        if self.cuda:
            self._torch.cuda.synchronize()
        out = {}
        for (_, a), (name, b) in zip(self.marks, self.marks[1:]):
            out[name] = out.get(name, 0.0) + (a.elapsed_time(b) if self.cuda else (b - a) / 1e6)
        self.marks.clear()
        return out
