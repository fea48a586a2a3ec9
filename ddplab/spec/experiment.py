"""`Experiment`: everything one run needs, validated before any process starts.

The spec travels to every rank as `run_dir/spec.json`, so it must round-trip through JSON exactly
and hash the same on every machine. It is in sections: the common fields below describe the model,
the data-parallel setup and where the ranks run; `task` is the task's own section (`spec/tasks.py`:
`Train()`, `AllReduceSweep(...)`, `BucketSweep(...)`), `fault` the fault injection (`spec/fault.py`) and
`straggler` a rank slowed on purpose (`spec/straggler.py`) and `link` an emulated network for DDP's
all-reduces (`spec/link.py`).
A field the task does not read must stay at its default, or the spec is refused naming it.
Used by every notebook, through `recipes` and `ddplab.run`.

Units are in the names where they matter (`bucket_cap_mb`, `timeout_s`); sizes of the built-in
models (`d_model`, `n_layers`, `n_heads`) are plain counts.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import re
from dataclasses import dataclass, field

from .checks import bad, is_int, is_number
from .fault import Fault
from .link import Link
from .straggler import Straggler
from .tasks import TaskSpec
from .train import Train

BUILTIN_MODELS = ("transformer", "mlp", "branchy")
OPTIMIZERS = ("sgd", "adam", "adamw")
BACKENDS = ("auto", "gloo", "nccl")
DEVICES = ("auto", "cpu", "cuda")
SYNC_MODES = ("ddp", "none")
LOSS_NORMS = ("rank-mean", "global-sample", "global-token")
DTYPES = ("float32", "float64")
PROBES = ("reference", "gradients", "buckets", "activations", "memory", "memory-snapshot", "readiness", "bytes",
          "profile")
SHARDING = ("none", "zero1", "fsdp2")
_FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
# upper bounds that keep a spec inside what one machine can hold or run (refused beyond them, before
# launch; what this machine's cores and memory allow is checked at launch, launch/preflight.py)
LIMITS = {"vocab_size": 10 ** 6, "d_model": 2 ** 14, "n_layers": 1024, "n_heads": 1024, "world_size": 1024,
          "accum_steps": 10 ** 4, "steps": 10 ** 6, "local_batch": 10 ** 5, "seq_len": 10 ** 5, "seed": 2 ** 31 - 1}
TIMEOUT_RANGE_S = (0.5, 7 * 86400)   # a collective's timeout: at least a scheduling hiccup, at most a week
MAX_BUCKET_CAP_MB = 2 ** 20          # 1 TiB: far beyond any model here
MAX_LR = 1e3                         # far above any useful rate; 1e308 overflowed in the optimizer
MAX_NAME_CHARS = 100                 # the run directory's name is this plus a hash


@dataclass(frozen=True, kw_only=True)
class Experiment:
    """One DDP experiment. Every field is checked in `__post_init__`; a bad value raises `ValueError`."""

    name: str = "experiment"
    task: TaskSpec = field(default_factory=Train)   # what the ranks do, with the task's own settings
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
    find_unused_parameters: bool = False     # DDP: find parameters a forward did not use (a graph walk per step)
    # torch's TORCH_DISTRIBUTED_DEBUG for DDP: "info" names the parameters that got no gradient in DDP's error
    distributed_debug: str = "off"
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
    fault: Fault | None = None               # fault injection (spec/fault.py), to study failures
    straggler: Straggler | None = None       # one rank slower by a known amount every step (spec/straggler.py)
    link: Link | None = None                 # DDP's all-reduces held to an emulated link (spec/link.py); None: loopback
    # extra measurements the ranks record
    probes: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self):
        for name in ("local_batch", "seq_len", "probes"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))
        object.__setattr__(self, "task", TaskSpec.from_dict(self.task))
        fault = Fault.from_dict(self.fault)
        if fault is not None and fault.rank is None:
            fault = dataclasses.replace(fault, rank=self.world_size - 1 if is_int(self.world_size) else 0)
        object.__setattr__(self, "fault", fault)
        object.__setattr__(self, "straggler", Straggler.from_dict(self.straggler))
        object.__setattr__(self, "link", Link.from_dict(self.link))
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
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["task"] = self.task.to_dict()
        d["fault"] = dataclasses.asdict(self.fault) if self.fault else None
        d["straggler"] = dataclasses.asdict(self.straggler) if self.straggler else None
        d["link"] = dataclasses.asdict(self.link) if self.link else None
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, indent=1)

    @classmethod
    def from_dict(cls, d: dict) -> "Experiment":
        if not isinstance(d, dict):
            raise ValueError(f"a spec is a JSON object of Experiment fields (got {type(d).__name__})")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown Experiment field(s): {', '.join(unknown)}")
        return cls(**d)

    @classmethod
    def from_json(cls, text: str) -> "Experiment":
        try:
            d = json.loads(text)
        except RecursionError:
            raise ValueError("a spec nested too deeply to be an Experiment's JSON") from None
        return cls.from_dict(d)

    @property
    def hash(self) -> str:
        """Short hash of every field that differs from its default; equal specs hash equally in any
        process, and a field added later with a default leaves older runs' hashes unchanged."""
        defaults = _defaults()
        changed = {k: v for k, v in self.to_dict().items() if v != defaults[k]}
        canon = json.dumps(changed, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canon.encode()).hexdigest()[:10]

    def replace(self, **changes) -> "Experiment":
        return dataclasses.replace(self, **changes)

    def ignored_fields(self) -> list[str]:
        """Fields set away from their default that this experiment's task does not read."""
        if self.task.reads is None:  # the task reads every field
            return []
        defaults = _defaults()
        mine = self.to_dict()
        reads = self.task.reads | {"name", "task"}
        return [k for k in mine if k not in reads and mine[k] != defaults[k]]


@functools.lru_cache(maxsize=1)
def _default_dict() -> dict:
    return Experiment().to_dict()


def _defaults() -> dict:
    """Every field's default as JSON values, built once (`hash` and `ignored_fields` compare with it)."""
    return dict(_default_dict())


def _validate(e: Experiment) -> None:
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


DISTRIBUTED_DEBUG = ("off", "info")


def _validate_unread_by_train(e: Experiment) -> None:
    """Settings the train task itself would ignore in this configuration."""
    without_ddp = "sync='none'" if e.sync != "ddp" else ("sharding='fsdp2'" if e.sharding == "fsdp2" else None)
    if e.distributed_debug == "detail":
        bad("distributed_debug", "'detail' wraps every process group in a collective checker, and DDP's constructor "
                                 "crashes on such a group with gloo in torch 2.13 (a segfault, notes/ddp-internals.md "
                                 "section 0): use 'info' with DDP; notebook 08 shows DETAIL's checks on plain "
                                 "collectives in a %%ddp cell")
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


MAX_PROFILED_STEPS = 20   # every step after the first is traced with stacks, shapes and memory: megabytes each


def _validate_probes(e: Experiment) -> None:
    if "profile" in e.probes and e.steps > MAX_PROFILED_STEPS:
        bad("probes", f"'profile' traces every step after the first (stacks, shapes, memory: megabytes a step): "
                      f"at most {MAX_PROFILED_STEPS} steps (got steps={e.steps}); profile a short run")
    if "memory-snapshot" in e.probes and "memory" not in e.probes:
        bad("probes", "'memory-snapshot' records the CUDA allocator beside the ledger: add 'memory' too")
    if "memory-snapshot" in e.probes and e.device == "cpu":
        bad("probes", "'memory-snapshot' needs CUDA (the caching allocator records it); device is 'cpu'")
