"""`Experiment`: everything one DDP run needs, validated before any process starts.

The spec travels to every rank as `run_dir/spec.json`, so it must round-trip through JSON exactly
and hash the same on every machine. Used by every notebook, through `recipes.py` and `ddplab.run`.

Units are in the names where they matter (`bucket_cap_mb`, `timeout_s`); sizes of the built-in
models (`d_model`, `n_layers`, `n_heads`) are plain counts.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from dataclasses import dataclass, field

BUILTIN_MODELS = ("transformer", "mlp", "branchy")
TASKS = ("train", "allreduce-sweep", "bucket-sweep")
OPTIMIZERS = ("sgd", "adam", "adamw")
BACKENDS = ("auto", "gloo", "nccl")
DEVICES = ("auto", "cpu", "cuda")
SYNC_MODES = ("ddp", "none")
LOSS_NORMS = ("rank-mean", "global-sample", "global-token")
DTYPES = ("float32", "float64")
FAULTS = (None, "crash", "skip-backward", "stall")
PROBES = ("reference", "gradients", "buckets", "activations", "memory", "memory-snapshot", "readiness", "bytes")
SHARDING = ("none", "zero1", "fsdp2")
_FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
# a bucket-sweep plan: "<kind>:<cap in MiB>"; ddp = torch DDP with the readiness and bucket probes,
# bare = torch DDP without probes, plan = BucketedSync with DDP's rule, split = the same with its last
# bucket cut in two; "ddp:default" and "bare:default" leave bucket_cap_mb at None
PLAN_KINDS = ("ddp", "bare", "plan", "split")
_PLAN = re.compile(r"^(ddp|bare|plan|split):(default|\d+(\.\d+)?(e-?\d+)?)$")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    """A finite int or float (not a bool, not inf or nan)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


@dataclass(frozen=True, kw_only=True)
class Experiment:
    """One DDP experiment. Every field is checked in `__post_init__`; a bad value raises `ValueError`."""

    name: str = "experiment"
    # "train": DDP training steps; "allreduce-sweep": time all_reduce over `sweep_bytes`, `repeats` times;
    # "bucket-sweep": time `steps` steps of every plan in `plans` (and of a compute-only step) in each of
    # `repeats` interleaved rounds, after 2 warm-up steps each
    task: str = "train"
    sweep_bytes: tuple[int, ...] = field(default_factory=tuple)
    repeats: int = 20
    plans: tuple[str, ...] = field(default_factory=tuple)
    # the network: a built-in name, or "package.module:factory" returning an nn.Module that maps
    # token ids (batch, seq_len) to logits (batch, seq_len, vocab_size)
    model: str = "transformer"
    vocab_size: int = 64
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    tie_weights: bool = False
    checkpointing: bool = False              # transformer: recompute each block's activations in backward
    # data parallelism
    world_size: int = 2
    local_batch: int | tuple[int, ...] = 8   # examples per rank per micro-step; one value or one per rank
    seq_len: int | tuple[int, ...] = 16      # tokens per example; one value or one per rank
    accum_steps: int = 1                     # micro-steps per optimizer step
    no_sync: bool = True                     # skip the all-reduce (DDP's no_sync) on all but the last micro-step
    steps: int = 1                           # optimizer steps
    sync: str = "ddp"                        # "ddp": DDP averages gradients; "none": each rank steps alone
    # how a rank's loss is normalized: "rank-mean" = mean over its own tokens (DDP then averages ranks);
    # "global-sample" / "global-token" = weighted so the gradient is the global mean per example / token
    loss_norm: str = "rank-mean"
    dtype: str = "float32"                   # parameters, gradients and the reference
    # what is sharded over the ranks: "none" (DDP: everything replicated), "zero1" (DDP plus
    # ZeroRedundancyOptimizer: optimizer state), "fsdp2" (fully_shard: parameters, gradients, state)
    sharding: str = "none"
    bucket_cap_mb: float | None = None       # None = DDP's default (25 MiB, first bucket 1 MiB)
    gradient_as_bucket_view: bool = False
    # optimization
    optimizer: str = "sgd"
    lr: float = 0.1
    momentum: float = 0.0                    # SGD only
    seed: int = 0
    seed_per_rank: bool = False              # rank r builds its model from seed + r (DDP's broadcast evens it out)
    # where and how the ranks run
    backend: str = "auto"                    # "auto": NCCL with one GPU per rank, else gloo on the CPU
    device: str = "auto"                     # "auto": CUDA for NCCL, CPU for gloo
    timeout_s: float = 60.0                  # how long a rank may wait in one collective
    pin_cpus: bool = False                   # CPU runs: pin rank r to core r mod cores (steadier timings)
    # fault injection, to study failures: "crash" raises, "skip-backward" skips the synchronized
    # backward and goes on to a barrier, "stall" stops the rank (it sleeps) before its backward
    fault: str | None = None
    fault_rank: int | None = None            # None = the last rank
    fault_step: int = 0
    # extra measurements the ranks record
    probes: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self):
        for name in ("local_batch", "seq_len", "probes", "sweep_bytes", "plans"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))
        if self.fault is not None and self.fault_rank is None:
            object.__setattr__(self, "fault_rank", self.world_size - 1 if _is_int(self.world_size) else 0)
        _validate(self)

    # ---- per-rank views -------------------------------------------------------------------
    def local_batch_of(self, rank: int) -> int:
        """Examples per micro-step on `rank`."""
        lb = self.local_batch
        return lb[rank] if isinstance(lb, tuple) else lb

    def seq_len_of(self, rank: int) -> int:
        """Tokens per example on `rank`."""
        sl = self.seq_len
        return sl[rank] if isinstance(sl, tuple) else sl

    @property
    def local_batches(self) -> list[int]:
        return [self.local_batch_of(r) for r in range(self.world_size)]

    @property
    def seq_lens(self) -> list[int]:
        return [self.seq_len_of(r) for r in range(self.world_size)]

    @property
    def global_batch(self) -> int:
        """Examples per optimizer step over all ranks: sum of local batches x accum_steps."""
        return sum(self.local_batches) * self.accum_steps

    # ---- JSON and identity ------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        for k, v in d.items():
            if isinstance(v, tuple):
                d[k] = list(v)
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, indent=1)

    @classmethod
    def from_dict(cls, d: dict) -> "Experiment":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown Experiment field(s): {', '.join(unknown)}")
        return cls(**d)

    @classmethod
    def from_json(cls, text: str) -> "Experiment":
        return cls.from_dict(json.loads(text))

    @property
    def hash(self) -> str:
        """Short hash of every field that differs from its default; equal specs hash equally in any
        process, and a field added later with a default leaves older runs' hashes unchanged."""
        defaults = Experiment().to_dict()
        changed = {k: v for k, v in self.to_dict().items() if v != defaults[k]}
        canon = json.dumps(changed, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canon.encode()).hexdigest()[:10]

    def replace(self, **changes) -> "Experiment":
        return dataclasses.replace(self, **changes)


def _validate(e: Experiment) -> None:
    def bad(field_name, why):
        raise ValueError(f"Experiment.{field_name}: {why}")

    if e.task not in TASKS:
        bad("task", f"must be one of {', '.join(TASKS)} (got {e.task!r})")
    if e.task == "allreduce-sweep":
        sizes = list(e.sweep_bytes)
        if not sizes or not all(_is_int(n) and n >= 4 and n % 4 == 0 for n in sizes) or len(set(sizes)) != len(sizes):
            bad("sweep_bytes", f"an all-reduce sweep needs distinct message sizes, multiples of 4 bytes "
                               f"(float32 elements) (got {sizes!r})")
        if e.fault is not None or e.probes:
            bad("task", "an all-reduce sweep takes no fault injection and no probes")
    if e.task == "bucket-sweep":
        plans = list(e.plans)
        bad_plans = [p for p in plans if not isinstance(p, str) or not _PLAN.match(p)
                     or not _plan_cap_ok(*parse_plan(p))]
        if not plans or bad_plans or len(set(plans)) != len(plans):
            bad("plans", f"a bucket sweep needs distinct plans '<kind>:<cap MiB>' with kind one of "
                         f"{', '.join(PLAN_KINDS)} and a cap > 0 ('default' for ddp and bare) (got {plans!r})")
        if e.fault is not None or e.probes or e.sync != "ddp" or e.sharding != "none" or e.accum_steps != 1:
            bad("task", "a bucket sweep probes every step itself: no fault, probes, sharding or accumulation, sync='ddp'")
        if any(isinstance(v, tuple) for v in (e.local_batch, e.seq_len)):
            bad("local_batch", "a bucket sweep gives every rank the same work: one local_batch and one seq_len")
    elif e.plans:
        bad("plans", f"only a task='bucket-sweep' takes plans (task is {e.task!r})")
    if not _is_int(e.repeats) or e.repeats < 1:
        bad("repeats", f"must be a positive integer (got {e.repeats!r})")
    if not isinstance(e.seed_per_rank, bool):
        bad("seed_per_rank", f"must be True or False (got {e.seed_per_rank!r})")
    if not isinstance(e.pin_cpus, bool):
        bad("pin_cpus", f"must be True or False (got {e.pin_cpus!r})")
    if not isinstance(e.checkpointing, bool):
        bad("checkpointing", f"must be True or False (got {e.checkpointing!r})")
    if not isinstance(e.name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", e.name):
        bad("name", f"use letters, digits, '_', '.' or '-' (got {e.name!r}); it names the run directory")
    if not isinstance(e.model, str) or not (e.model in BUILTIN_MODELS or _FACTORY.match(e.model)):
        bad("model", f"must be one of {', '.join(BUILTIN_MODELS)} or 'package.module:factory' (got {e.model!r})")
    for name in ("vocab_size", "d_model", "n_layers", "n_heads", "world_size", "accum_steps", "steps"):
        v = getattr(e, name)
        if not _is_int(v) or v < 1:
            bad(name, f"must be a positive integer (got {v!r})")
    if e.vocab_size < 2:
        bad("vocab_size", f"needs at least 2 tokens (got {e.vocab_size})")
    if e.model == "transformer" and e.d_model % e.n_heads:
        bad("n_heads", f"must divide d_model={e.d_model} (got {e.n_heads})")
    if not isinstance(e.tie_weights, bool):
        bad("tie_weights", f"must be True or False (got {e.tie_weights!r})")
    for name in ("local_batch", "seq_len"):
        v = getattr(e, name)
        values = v if isinstance(v, tuple) else (v,)
        if isinstance(v, tuple) and len(v) != e.world_size:
            bad(name, f"has {len(v)} entries but world_size is {e.world_size}; give one value or one per rank")
        if not values or not all(_is_int(x) and x >= 1 for x in values):
            bad(name, f"must be a positive integer or a list of them, one per rank (got {v!r})")
    if not isinstance(e.no_sync, bool):
        bad("no_sync", f"must be True or False (got {e.no_sync!r})")
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
    if e.bucket_cap_mb is not None and (not _is_number(e.bucket_cap_mb) or not e.bucket_cap_mb > 0):
        bad("bucket_cap_mb", f"must be a positive number of MiB, or None for DDP's default (got {e.bucket_cap_mb!r})")
    if not isinstance(e.gradient_as_bucket_view, bool):
        bad("gradient_as_bucket_view", f"must be True or False (got {e.gradient_as_bucket_view!r})")
    if e.optimizer not in OPTIMIZERS:
        bad("optimizer", f"must be one of {', '.join(OPTIMIZERS)} (got {e.optimizer!r})")
    if not _is_number(e.lr) or not e.lr > 0:
        bad("lr", f"must be a positive number (got {e.lr!r})")
    if not _is_number(e.momentum) or not 0 <= e.momentum < 1:
        bad("momentum", f"must be in [0, 1) (got {e.momentum!r})")
    if e.momentum and e.optimizer != "sgd":
        bad("momentum", f"applies to optimizer='sgd' only (optimizer is {e.optimizer!r})")
    if not _is_int(e.seed) or e.seed < 0:
        bad("seed", f"must be a non-negative integer (got {e.seed!r})")
    if e.backend not in BACKENDS:
        bad("backend", f"must be one of {', '.join(BACKENDS)} (got {e.backend!r})")
    if e.device not in DEVICES:
        bad("device", f"must be one of {', '.join(DEVICES)} (got {e.device!r})")
    if e.backend == "nccl" and e.device == "cpu":
        bad("device", "NCCL needs CUDA tensors; use device='cuda' or 'auto', or backend='gloo' for the CPU")
    if not _is_number(e.timeout_s) or not e.timeout_s > 0:
        bad("timeout_s", f"must be a positive number of seconds (got {e.timeout_s!r})")
    if e.fault not in FAULTS:
        bad("fault", f"must be one of None, 'crash', 'skip-backward', 'stall' (got {e.fault!r})")
    if e.fault is not None:
        if not _is_int(e.fault_rank) or not 0 <= e.fault_rank < e.world_size:
            bad("fault_rank", f"must be a rank in 0..{e.world_size - 1} (got {e.fault_rank!r})")
        if not _is_int(e.fault_step) or not 0 <= e.fault_step < e.steps:
            bad("fault_step", f"must be a step in 0..{e.steps - 1} (got {e.fault_step!r})")
        if e.fault == "skip-backward" and e.world_size < 2:
            bad("fault", "'skip-backward' needs world_size >= 2: with one rank nobody waits for it")
        if e.fault == "skip-backward" and e.sync != "ddp":
            bad("fault", "'skip-backward' needs sync='ddp': without synchronization nobody waits for it")
    if "memory-snapshot" in e.probes and "memory" not in e.probes:
        bad("probes", "'memory-snapshot' records the CUDA allocator beside the ledger: add 'memory' too")
    if "memory-snapshot" in e.probes and e.device == "cpu":
        bad("probes", "'memory-snapshot' needs CUDA (the caching allocator records it); device is 'cpu'")
    if not all(isinstance(p, str) and p in PROBES for p in e.probes):
        bad("probes", f"each probe must be one of {', '.join(PROBES)} (got {list(e.probes)!r})")


def _plan_cap_ok(kind: str, cap: float | None) -> bool:
    """A cap > 0, or DDP's default (None) for the kinds that are torch DDP."""
    return cap > 0 if cap is not None else kind in ("ddp", "bare")


def parse_plan(plan: str) -> tuple[str, float | None]:
    """"split:4" -> ("split", 4.0); "ddp:default" -> ("ddp", None)."""
    kind, cap = plan.split(":")
    return kind, None if cap == "default" else float(cap)
