"""`Experiment`: everything one run needs, validated before any process starts.

The spec travels to every rank as `run_dir/spec.json`, so it must round-trip through JSON exactly
and hash the same on every machine. It is in sections: the common fields below describe the model,
the data-parallel setup and where the ranks run; `task` is the task's own section (`spec/<task>.py`:
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

from .checks import is_int, only_fields
from .fault import Fault
from .link import LINKS, Link  # noqa: F401 (LINKS: the link field's documentation)
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
DISTRIBUTED_DEBUG = ("off", "info")
MAX_PROFILED_STEPS = 20   # every step after the first is traced with stacks, shapes and memory: megabytes each


@dataclass(frozen=True, kw_only=True)
class Experiment:
    """One DDP experiment. Every field is checked in `__post_init__`; a bad value raises `ValueError`."""

    name: str = "experiment"
    """run name (names the run directory)"""
    task: TaskSpec = field(default_factory=Train)
    """what the ranks do, with the task's own settings (spec/<task>.py)"""
    model: str = "transformer"
    """{BUILTIN_MODELS}, or package.module:factory returning an nn.Module that maps token ids (batch,
    seq_len) to logits (batch, seq_len, vocab_size) (importable from here)"""
    vocab_size: int = 64
    """tokens in the vocabulary"""
    d_model: int = 64
    """width of the built-in models"""
    n_layers: int = 2
    """blocks (transformer) or hidden layers (mlp)"""
    n_heads: int = 4
    """attention heads (transformer)"""
    tie_weights: bool = False
    """transformer: the LM head reuses the token embedding"""
    checkpointing: bool = False
    """transformer: recompute each block's activations in backward"""
    world_size: int = 2
    """number of ranks"""
    local_batch: int | tuple[int, ...] = 8
    """examples per rank per micro-step: N, or N0,N1,... one per rank"""
    seq_len: int | tuple[int, ...] = 16
    """tokens per example: N, or one per rank"""
    accum_steps: int = 1
    """micro-steps per optimizer step"""
    no_sync: bool = True
    """skip the all-reduce (DDP's no_sync) on all but the last micro-step"""
    steps: int = 1
    """optimizer steps"""
    sync: str = "ddp"
    """{SYNC_MODES}: DDP averages gradients (ddp), or each rank steps alone (none)"""
    loss_norm: str = "rank-mean"
    """how a rank's loss is normalized, {LOSS_NORMS}: rank-mean is the mean over its own tokens (DDP
    then averages ranks); global-sample and global-token weigh it so the gradient is the global mean per
    example or per token"""
    dtype: str = "float32"
    """parameters, gradients and the reference: {DTYPES}"""
    sharding: str = "none"
    """what is sharded over the ranks, {SHARDING}: none (DDP, everything replicated), zero1 (DDP plus
    ZeroRedundancyOptimizer: optimizer state), fsdp2 (fully_shard: parameters, gradients, state)"""
    bucket_cap_mb: float | None = None
    """DDP bucket cap in MiB; None (on the command line 'none') keeps DDP's default (25 MiB, first bucket 1 MiB)"""
    gradient_as_bucket_view: bool = False
    """DDP: gradients are views into the buckets"""
    find_unused_parameters: bool = False
    """DDP: find the parameters a forward did not use (a graph walk per step)"""
    distributed_debug: str = "off"
    """{DISTRIBUTED_DEBUG}: torch's TORCH_DISTRIBUTED_DEBUG for DDP (info names the parameters that got no
    gradient in DDP's error)"""
    optimizer: str = "sgd"
    """{OPTIMIZERS}"""
    lr: float = 0.1
    """learning rate"""
    momentum: float = 0.0
    """SGD momentum"""
    seed: int = 0
    """seed for the model and the data"""
    seed_per_rank: bool = False
    """rank r builds its model from seed + r (DDP's broadcast evens it out)"""
    backend: str = "auto"
    """{BACKENDS}: auto is NCCL with one GPU per rank, else gloo on the CPU"""
    device: str = "auto"
    """{DEVICES}: auto is CUDA for NCCL, CPU for gloo"""
    timeout_s: float = 60.0
    """seconds a rank may wait in one collective"""
    pin_cpus: bool = False
    """CPU runs: pin rank r to core r mod cores (steadier timings)"""
    fault: Fault | None = None
    """fault injection, to study failures (spec/fault.py)"""
    straggler: Straggler | None = None
    """one rank slower by a known amount every step (spec/straggler.py)"""
    link: Link | None = None
    """hold DDP's all-reduces to an emulated link (needs the buckets probe): {LINKS}, or LATENCY_US:GBIT_S
    such as 100:2 (spec/link.py); None: loopback as it is"""
    probes: tuple[str, ...] = field(default_factory=tuple)
    """extra measurements the ranks record, any of: {PROBES}"""

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
        from .validate import check_experiment   # (it reads this module's choices and limits)

        check_experiment(self)

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
        return cls(**only_fields(cls, d, "a spec"))

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
def field_docs(cls=None) -> dict[str, str]:
    """Each field's documentation, written once: the string under it in the class body, with `{NAME}`
    replaced by that choice tuple of this module joined by ', '. The command line's help reads it."""
    import ast
    import inspect
    import textwrap

    cls = cls or Experiment
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    docs = {}
    for stmt, after in zip(body, body[1:]):
        if isinstance(stmt, ast.AnnAssign) and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
            text = " ".join(after.value.value.split())
            docs[stmt.target.id] = re.sub(r"\{([A-Z_]+)\}", lambda m: ", ".join(globals()[m.group(1)]), text)
    return docs


def _default_dict() -> dict:
    return Experiment().to_dict()


def _defaults() -> dict:
    """Every field's default as JSON values, built once (`hash` and `ignored_fields` compare with it)."""
    return dict(_default_dict())
