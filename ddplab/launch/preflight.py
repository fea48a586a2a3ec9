"""Refuse what cannot run here before any process starts: one backend and device per launch, no NCCL
rank without a GPU, CUDA-only probes on CUDA, a user's model that maps token ids to logits and whose
backward reaches a parameter, and no more ranks or memory than this machine has
(`DDPLAB_SKIP_SIZE_CHECKS=1` lifts the last two).
Used by every launch (every notebook).
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

from .. import host
from ..folded import working
from ..spec import Experiment
from ..predict.memory import rank_bytes_estimate
from ..spec.experiment import BUILTIN_MODELS
from .nodes import Nodes


def check_launch(exps: list[Experiment], nodes: Nodes | None = None) -> tuple[str, str]:
    """Check every experiment of a launch on `nodes` (default `Nodes.from_env()`); return the launch's
    (backend, device type). The GPUs, cores and memory checked are this host's, for the ranks that
    run on it: all of them on one node or simulated nodes, one node's share under srun."""
    nodes = Nodes.from_env() if nodes is None else nodes
    nodes.check_here()
    widest = max(e.world_size for e in exps)
    if nodes.count > widest:
        raise ValueError(f"DDPLAB_NODES: {nodes.count} nodes for a launch of {widest} rank(s); every node runs at "
                         f"least one rank, so use at most {widest} nodes (or more ranks)")
    cuda_devices = host.cuda_device_count()
    choices = {host.choose_backend(e.backend, e.device, nodes.ranks_here(e.world_size), cuda_devices) for e in exps}
    if len(choices) > 1:
        raise ValueError(f"experiments: one launch runs on one backend and device, but these need "
                         f"{sorted(choices)}; run them in separate launches")
    backend, device = choices.pop()
    if device != "cuda" and any("memory-snapshot" in e.probes for e in exps):
        raise ValueError("Experiment.probes: 'memory-snapshot' needs the ranks on CUDA; this launch runs on the CPU")
    for e in exps:
        parameter_bytes, per_example = None, None
        builds = e.task.reads is None or "model" in e.task.reads
        built = None   # a user's model, built once here: checked, counted, and its activations measured
        if e.model not in BUILTIN_MODELS and builds:
            model, built = _checked_build(e)
            parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        if device == "cpu" and not os.environ.get("DDPLAB_SKIP_SIZE_CHECKS"):
            if builds and e.task.kind in ("train", "bucket-sweep", "resume") and e.model not in COUNTED_MODELS:
                per_example = measured_activations(e, built)   # no formula for its shapes: one small forward
            check_fits(e, parameter_bytes, nodes.ranks_here(e.world_size), per_example)
    return backend, device


def check_user_model(exp: Experiment, gradients: bool = False):
    """Build `exp`'s user model here and check what it returns (spec/model.py) and that one backward
    gives some trainable parameter a gradient; with `gradients`, every one (DDP waits for each of them,
    and the audit and tune tools read every bucket). Returns the module; a ValueError says what to fix."""
    return _checked_build(exp, gradients)[0]


def _checked_build(exp: Experiment, gradients: bool = False):
    """`check_user_model`, returning (the module, what `rank.models.build_with_data` built, or None for
    a task that reads no tokens), so the caller can measure the same model instead of building another.
    The caller's random stream stays as it was."""
    import torch

    from ..rank import models  # builds the user's model once here, to say what is wrong in this process

    said = working(f"ddplab: building {exp.model} here, to check it before any rank starts")
    with said, _importable_from_here(), torch.random.fork_rng(devices=[]):   # as in the ranks (PYTHONPATH)
        reads_tokens = exp.task.feeds_own_data
        try:
            with _no_process_exit():
                built = models.build_with_data(exp) if reads_tokens else None
                model = built.module if built else models.build(exp)
        except _ProcessExit as e:   # (sys.exit is a SystemExit, which rank.models already refuses)
            raise ValueError(f"Experiment.model: {exp.model} tried to end the process (os._exit({e.code!r})) "
                             f"while it was built; a factory must return a model") from None
        except ValueError as e:
            if str(e).startswith("Experiment.model"):
                raise
            raise ValueError(f"Experiment.model: {exp.model} raised ValueError: {e}") from e
        except Exception as e:   # said once, with its type, and chained (the traceback stays)
            raise ValueError(f"Experiment.model: {exp.model} raised {type(e).__name__}: {e}") from e
        own = built.batch if built and built.own_data else None   # the factory's own examples, if it brings them
        if own and exp.loss_norm == "global-token":
            raise ValueError(f"Experiment.loss_norm: 'global-token' counts seq_len targets per example, and "
                             f"{exp.model} brings its own targets (ModelWithData); use 'rank-mean' or 'global-sample'")
        models.check_model(model, exp, own)
        unused = _without_gradient(model, exp, built.batch if built else models.build_with_data(exp).batch)
        if gradients:
            if unused and not exp.find_unused_parameters:
                shown = ", ".join(unused[:8]) + (f" and {len(unused) - 8} more" if len(unused) > 8 else "")
                raise ValueError(f"Experiment.model: {exp.model} leaves {len(unused)} trainable parameter(s) without a "
                                 f"gradient after one forward and backward: {shown}. DDP would never reduce the bucket "
                                 f"that holds them: freeze them (requires_grad_(False)) or leave them out of the model")
    return model, built


def _without_gradient(model, exp: Experiment, batch) -> list[str]:
    """The trainable parameters one forward and backward leaves without a gradient (`rank.models.
    unused_parameters`); a ValueError when that is every one of them: such a run would end "complete"
    with every parameter where it started (DDP syncs nothing, the optimizer skips what has no grad)."""
    from ..rank import models

    trainable = sum(1 for p in model.parameters() if p.requires_grad)
    try:
        unused = models.unused_parameters(model, exp, batch)
    except Exception as e:   # said once, with its type, and chained, as a failing build is
        if "does not require grad" not in str(e):
            raise ValueError(f"Experiment.model: {exp.model}'s backward raised {type(e).__name__}: {e}") from e
        unused = [n for n, p in model.named_parameters() if p.requires_grad]   # its loss has no graph at all
    if trainable and len(unused) == trainable:
        raise ValueError(f"Experiment.model: {exp.model}'s forward gives no trainable parameter a gradient: one "
                         f"forward and backward on two examples left all {trainable} without one (does forward "
                         f"detach its output, or run under torch.no_grad()?). Training would leave every parameter "
                         f"where it started")
    return unused


class _ProcessExit(BaseException):
    """os._exit called by a factory while the launcher builds it (`_no_process_exit`)."""

    def __init__(self, code):
        super().__init__(code)
        self.code = code


@contextlib.contextmanager
def _no_process_exit():
    """os._exit raises instead of ending the launcher (a notebook's kernel) while a user's factory runs."""
    real = os._exit

    def refuse(code):
        raise _ProcessExit(code)
    os._exit = refuse
    try:
        yield
    finally:
        os._exit = real


MAX_RANKS_PER_CORE = 4   # 4 gloo ranks on 2 cores is the lab's oversubscription demo; more only thrash


COUNTED_MODELS = ("transformer", "mlp")   # predict/memory.py counts their activations from the shapes


def measured_activations(exp: Experiment, built=None) -> int:
    """Bytes of activations per example of `exp`'s model (`rank.models.saved_bytes_per_example`), on
    `built` (what `_checked_build` made) or on a model built here."""
    import torch

    from ..rank import models

    with _importable_from_here(), torch.random.fork_rng(devices=[]):   # the caller's random stream stays as it was
        built = built if built is not None else models.build_with_data(exp)
        return models.saved_bytes_per_example(built.module, exp, built.batch if built.own_data else None)


def memory_available(cgroup_root: str = "/sys/fs/cgroup") -> tuple[int, str]:
    """Bytes this process may still allocate, and where that limit comes from: the machine's available
    memory, or a cgroup's limit less its usage when that is smaller (a container, a SLURM job)."""
    import psutil

    have, where = psutil.virtual_memory().available, "this machine has"
    root = Path(cgroup_root)
    own = ""   # this process's cgroup (v2: the "0::" line of /proc/self/cgroup), e.g. a SLURM job's
    try:
        own = next((ln.split("::", 1)[1] for ln in Path("/proc/self/cgroup").read_text().splitlines()
                    if ln.startswith("0::")), "").strip("/")
    except OSError:
        pass
    mine = root / own if own and (root / own / "memory.max").exists() else root
    for limit_file, used_file in ((mine / "memory.max", mine / "memory.current"),
                                  (root / "memory/memory.limit_in_bytes", root / "memory/memory.usage_in_bytes")):
        try:
            limit, used = limit_file.read_text().strip(), int(used_file.read_text().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) - used < have:
            have, where = max(0, int(limit) - used), "this process's cgroup leaves"
        break
    return have, where


def check_fits(exp: Experiment, parameter_bytes: int | None = None, ranks_here: int | None = None,
               activations_per_example: int | None = None) -> None:
    """ValueError if this machine's cores or available memory cannot hold the `ranks_here` ranks of
    `exp` it runs (default all of them). `activations_per_example`: measured, for a model the lab
    cannot count (a user's, branchy); its activations are that times the largest local batch."""

    ranks = exp.world_size if ranks_here is None else ranks_here
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if ranks > MAX_RANKS_PER_CORE * cores:
        raise ValueError(f"Experiment.world_size: {ranks} CPU ranks on {cores} core(s) is more than "
                         f"{MAX_RANKS_PER_CORE} per core; use fewer ranks (or set DDPLAB_SKIP_SIZE_CHECKS=1)")
    acts = 2 * activations_per_example * max(exp.local_batches) if activations_per_example else 0
    need = ranks * (rank_bytes_estimate(exp, parameter_bytes) + acts)
    have, where = memory_available()
    if need > 0.8 * have:
        raise ValueError(f"Experiment.world_size: {ranks} ranks of this experiment would need about "
                         f"{need / 2 ** 30:.1f} GiB, and {where} {have / 2 ** 30:.1f} GiB available; use a "
                         f"smaller model, batch or fewer ranks (or set DDPLAB_SKIP_SIZE_CHECKS=1)")


@contextlib.contextmanager
def _importable_from_here():
    """The current directory on sys.path while the block runs (a console script's sys.path lacks it)."""
    here = os.getcwd()
    added = here not in sys.path
    if added:
        sys.path.insert(0, here)
    try:
        yield
    finally:
        if added and here in sys.path:
            sys.path.remove(here)
