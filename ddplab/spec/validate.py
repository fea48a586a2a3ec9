"""Every check of an `Experiment`'s common fields, run by `Experiment.__post_init__` before anything
is launched; a bad value raises a ValueError naming the field (`checks.bad`). The choices and limits
they hold a field to are the spec's own (`spec/experiment.py`)."""

from __future__ import annotations

import re

from .checks import bad, is_int, is_number
from .experiment import (BACKENDS, BUILTIN_MODELS, DEVICES, DISTRIBUTED_DEBUG, DTYPES, LIMITS, LOSS_NORMS,
                         MAX_BUCKET_CAP_MB, MAX_LR, MAX_NAME_CHARS, MAX_PROFILED_STEPS, OPTIMIZERS, PROBES, SHARDING,
                         SYNC_MODES, TIMEOUT_RANGE_S, _FACTORY, Experiment)


def check_experiment(e: Experiment) -> None:
    ignored = e.ignored_fields() if isinstance(e.world_size, int) else []
    if ignored:
        also = f" (also set but unread: {', '.join(ignored[1:])})" if ignored[1:] else ""
        bad(ignored[0], f"the {e.task.kind} task does not read it; leave it at its default{also}")
    for name in ("seed_per_rank", "pin_cpus", "checkpointing", "tie_weights", "no_sync", "gradient_as_bucket_view",
                 "find_unused_parameters"):
        if not isinstance(getattr(e, name), bool):
            bad(name, f"must be True or False (got {getattr(e, name)!r})")
    if not isinstance(e.name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", e.name):
        bad("name", f"use letters, digits, '_', '.' or '-' (got {e.name!r}); it names the run directory")
    if len(e.name) > MAX_NAME_CHARS:
        bad("name", f"at most {MAX_NAME_CHARS} characters (got {len(e.name)}); it names the run directory")
    if not isinstance(e.probes, tuple) or not all(isinstance(p, str) and p in PROBES for p in e.probes):
        bad("probes", f"must be a tuple of probe names from {', '.join(PROBES)} (got {e.probes!r})")
    if not isinstance(e.model, str) or not (e.model in BUILTIN_MODELS or _FACTORY.match(e.model)):
        bad("model", f"must be one of {', '.join(BUILTIN_MODELS)} or 'package.module:factory' (got {e.model!r})")
    for name in ("vocab_size", "d_model", "n_layers", "n_heads", "world_size", "accum_steps", "steps"):
        v = getattr(e, name)
        if not is_int(v) or v < 1:
            bad(name, f"must be a positive integer (got {v!r})")
        if v > LIMITS[name]:
            bad(name, f"at most {LIMITS[name]} in this lab (got {v})")
    if e.vocab_size < 2:
        bad("vocab_size", f"needs at least 2 tokens (got {e.vocab_size})")
    if e.model == "transformer" and e.d_model % e.n_heads:
        bad("n_heads", f"must divide d_model={e.d_model} (got {e.n_heads})")
    _validate_data_parallel(e)
    if e.task.kind == "train":
        _validate_unread_by_train(e)
    _validate_optimization(e)
    _validate_placement(e)
    if e.fault is not None:
        e.fault.check(e)
    if e.straggler is not None:
        e.straggler.check(e)
    if e.link is not None:
        e.link.check(e)
    _validate_probes(e)
    e.task.check(e)


def _validate_data_parallel(e: Experiment) -> None:
    for name in ("local_batch", "seq_len"):
        v = getattr(e, name)
        values = v if isinstance(v, tuple) else (v,)
        if isinstance(v, tuple) and len(v) != e.world_size:
            bad(name, f"has {len(v)} entries but world_size is {e.world_size}; give one value or one per rank")
        if not values or not all(is_int(x) and x >= 1 for x in values):
            bad(name, f"must be a positive integer or a list of them, one per rank (got {v!r})")
        if max(values) > LIMITS[name]:
            bad(name, f"at most {LIMITS[name]} per rank in this lab (got {max(values)})")
    if e.loss_norm not in LOSS_NORMS:
        bad("loss_norm", f"must be one of {', '.join(LOSS_NORMS)} (got {e.loss_norm!r})")
    if e.dtype not in DTYPES:
        bad("dtype", f"must be one of {', '.join(DTYPES)} (got {e.dtype!r})")
    if e.sharding not in SHARDING:
        bad("sharding", f"must be one of {', '.join(SHARDING)} (got {e.sharding!r})")
    if e.sharding != "none":
        if e.sync != "ddp":
            bad("sharding", f"{e.sharding!r} synchronizes gradients itself; it needs sync='ddp'")
        if e.accum_steps != 1 or e.fault is not None:
            bad("sharding", f"{e.sharding!r} runs here with accum_steps=1 and no fault injection")
        if e.sharding == "fsdp2" and set(e.probes) & {"gradients", "reference", "buckets", "readiness"}:
            bad("probes", "the gradients, reference, buckets and readiness probes follow DDP; use 'memory' with fsdp2")
        if e.sharding == "fsdp2" and e.tie_weights:
            bad("tie_weights", "fsdp2 shards each block separately and cannot shard one weight in two places")
    if e.sync not in SYNC_MODES:
        bad("sync", f"must be one of {SYNC_MODES} (got {e.sync!r})")
    if e.bucket_cap_mb is not None and (not is_number(e.bucket_cap_mb) or not 0 < e.bucket_cap_mb <= MAX_BUCKET_CAP_MB):
        bad("bucket_cap_mb", f"must be a number of MiB in (0, {MAX_BUCKET_CAP_MB}], or None for DDP's default "
                             f"(got {e.bucket_cap_mb!r})")


def _validate_unread_by_train(e: Experiment) -> None:
    """Settings the train task itself would ignore in this configuration."""
    without_ddp = "sync='none'" if e.sync != "ddp" else ("sharding='fsdp2'" if e.sharding == "fsdp2" else None)
    if e.distributed_debug == "detail":
        bad("distributed_debug", "'detail' wraps every process group in a collective checker, and DDP's constructor "
                                 "crashes on such a group with gloo (a segfault, on every torch the lab verifies): use 'info' with DDP; notebook 08 "
                                 "shows DETAIL's checks on plain collectives in a %%ddp cell")
    if e.distributed_debug not in DISTRIBUTED_DEBUG:
        bad("distributed_debug", f"must be one of {', '.join(DISTRIBUTED_DEBUG)} (got {e.distributed_debug!r})")
    if without_ddp and e.distributed_debug != "off":
        bad("distributed_debug", f"sets DDP's debug level, and with {without_ddp} there is no DDP; leave it 'off'")
    if without_ddp:
        for name in ("bucket_cap_mb", "gradient_as_bucket_view", "find_unused_parameters"):
            if getattr(e, name) not in (None, False):   # their defaults
                bad(name, f"configures DDP's buckets, and with {without_ddp} there is no DDP; leave it at its default")
        if "buckets" in e.probes:
            bad("probes", f"'buckets' observes DDP's buckets, and with {without_ddp} there is no DDP")
    if not e.no_sync and e.accum_steps == 1:
        bad("no_sync", "no_sync=False changes nothing with accum_steps=1 (there is one micro-step); leave it True")


def _validate_optimization(e: Experiment) -> None:
    if e.optimizer not in OPTIMIZERS:
        bad("optimizer", f"must be one of {', '.join(OPTIMIZERS)} (got {e.optimizer!r})")
    if not is_number(e.lr) or not 0 < e.lr <= MAX_LR:
        bad("lr", f"must be a positive number up to {MAX_LR:g} (got {e.lr!r})")
    if not is_number(e.momentum) or not 0 <= e.momentum < 1:
        bad("momentum", f"must be in [0, 1) (got {e.momentum!r})")
    if e.momentum and e.optimizer != "sgd":
        bad("momentum", f"applies to optimizer='sgd' only (optimizer is {e.optimizer!r})")
    if not is_int(e.seed) or not 0 <= e.seed <= LIMITS["seed"]:
        bad("seed", f"must be an integer in 0..{LIMITS['seed']} (got {e.seed!r})")


def _validate_placement(e: Experiment) -> None:
    if e.backend not in BACKENDS:
        bad("backend", f"must be one of {', '.join(BACKENDS)} (got {e.backend!r})")
    if e.device not in DEVICES:
        bad("device", f"must be one of {', '.join(DEVICES)} (got {e.device!r})")
    if e.backend == "nccl" and e.device == "cpu":
        bad("device", "NCCL needs CUDA tensors; use device='cuda' or 'auto', or backend='gloo' for the CPU")
    lo, hi = TIMEOUT_RANGE_S
    if not is_number(e.timeout_s) or not lo <= e.timeout_s <= hi:
        bad("timeout_s", f"must be a number of seconds in [{lo:g}, {hi:g}] (got {e.timeout_s!r})")


def _validate_probes(e: Experiment) -> None:
    if "profile" in e.probes and e.steps > MAX_PROFILED_STEPS:
        bad("probes", f"'profile' traces every step after the first (stacks, shapes, memory: megabytes a step): "
                      f"at most {MAX_PROFILED_STEPS} steps (got steps={e.steps}); profile a short run")
    if "memory-snapshot" in e.probes and "memory" not in e.probes:
        bad("probes", "'memory-snapshot' records the CUDA allocator beside the ledger: add 'memory' too")
    if "memory-snapshot" in e.probes and e.device == "cpu":
        bad("probes", "'memory-snapshot' needs CUDA (the caching allocator records it); device is 'cpu'")
