"""What a plan asks: one model, one strategy, one world size, one step's shape (pure: no torch).

A plan runs one step of the model in one process, as rank 0 of a fake process group of `world_size`
ranks, under `FakeTensorMode` (tensors with shapes and no data), so torch's own DDP, ZeRO-1 and FSDP2
code decides what rank 0 holds and which collectives it issues (`rank/planner.py`).

    PlanSpec(model="hf:llama-2-7b", world_size=64, strategy="fsdp2", seq_len=2048)
    PlanSpec(model="transformer", d_model=256, n_layers=4, world_size=8, strategy="zero1")

Models: the lab's built-in ones, a user's factory ("package.module:factory", the contract of
spec/model.py), or a Hugging Face causal LM from its config: `hf:NAME` for a config below (the
published `config.json` fields, random weights: nothing is downloaded) or `hf:PATH` to a `config.json`
(read as data: no model code from the folder runs). Used by notebook 12 and `ddplab plan`.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from pathlib import Path

from .checks import only_fields

STRATEGIES = ("ddp", "zero1", "fsdp2")
PLAN_DTYPES = ("float32", "bfloat16")
PLAN_OPTIMIZERS = ("sgd", "adam", "adamw")
PLAN_MODELS = ("transformer", "mlp")   # branchy's unused-by-design head is no model to plan
MAX_WORLD_SIZE = 1 << 20
MAX_TOKENS = 1 << 20                   # local_batch x seq_len of one rank
MAX_PARAMETERS = 2 * 10**12            # checked on the meta device before the step is traced
_FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")

# Hugging Face configs by name: the fields of each model's published config.json that decide its shapes
# (https://huggingface.co/meta-llama/Llama-2-7b-hf/blob/main/config.json,
#  https://huggingface.co/openai-community/gpt2/blob/main/config.json); the rest are transformers' defaults
HF_CONFIGS = {
    "llama-2-7b": {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                   "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32000,
                   "max_position_embeddings": 4096, "tie_word_embeddings": False},
    "gpt2": {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257, "n_positions": 1024},
    # a small Llama for tests and the laptop-sized validation (the same code paths as the 7 B one)
    "llama-tiny": {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                   "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 128,
                   "max_position_embeddings": 256, "tie_word_embeddings": False},
}


def bad(field_name: str, why: str):
    raise ValueError(f"PlanSpec.{field_name}: {why}")


def _int_in(name: str, v, low: int, high: int) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or not low <= v <= high:
        bad(name, f"must be an integer in {low}..{high} (got {v!r})")


@dataclass(frozen=True, kw_only=True)
class PlanSpec:
    """One plan. Every field is checked in `__post_init__`; a bad value raises `ValueError` naming it."""

    model: str = "transformer"
    """transformer or mlp (built in), package.module:factory, hf:NAME ({HF}) or hf:PATH/config.json"""
    vocab_size: int = 64
    """built-in models and factories: tokens in the vocabulary"""
    d_model: int = 64
    """built-in models and factories: width"""
    n_layers: int = 2
    """built-in models and factories: blocks"""
    n_heads: int = 4
    """built-in models and factories: attention heads"""
    tie_weights: bool = False
    """built-in transformer: the LM head reuses the token embedding"""
    world_size: int = 8
    """ranks of the (fake) process group"""
    strategy: str = "ddp"
    """ddp (everything replicated), zero1 (DDP plus ZeroRedundancyOptimizer), fsdp2 (fully_shard)"""
    reshard_after_forward: bool = True
    """fsdp2: free each layer's gathered parameters after its forward (False keeps them to its backward)"""
    checkpointing: bool = False
    """recompute each layer's activations in backward (torch's checkpoint_wrapper on every layer)"""
    local_batch: int = 8
    """examples per rank per step"""
    seq_len: int = 16
    """tokens per example"""
    dtype: str = "float32"
    """parameters and gradients: float32 or bfloat16"""
    optimizer: str = "adamw"
    """sgd, adam or adamw"""
    foreach: bool | None = None
    """the optimizer's foreach implementation; None is torch's default for the planner's CPU tensors (one tensor
    at a time; on GPUs torch picks foreach: set True to plan that)"""
    first_step: bool = False
    """plan the first step, where the optimizer creates its state (False: a step after it)"""
    bucket_cap_mb: float | None = None
    """DDP's bucket cap in MiB; None keeps DDP's default (25 MiB)"""
    timeout_s: float = 300.0
    """seconds the planner process may take"""

    def __post_init__(self):
        m = self.model
        if not isinstance(m, str) or not (m in PLAN_MODELS or _FACTORY.match(m) or m.startswith("hf:")):
            bad("model", f"must be one of {', '.join(PLAN_MODELS)}, 'package.module:factory', 'hf:NAME' "
                         f"({', '.join(HF_CONFIGS)}) or 'hf:PATH/config.json' (got {m!r})")
        if m.startswith("hf:") and m[3:] not in HF_CONFIGS and not m.endswith(".json"):
            bad("model", f"{m!r}: 'hf:' takes one of {', '.join(HF_CONFIGS)} or a path to a config.json")
        if m.startswith("hf:") and m.endswith(".json") and not Path(m[3:]).is_file():
            bad("model", f"{m!r}: no such file")
        if not m.startswith("hf:"):   # the lab's models and factories take the Experiment's sizes, with its limits
            self._check_sizes()
        _int_in("world_size", self.world_size, 1, MAX_WORLD_SIZE)
        if self.strategy not in STRATEGIES:
            bad("strategy", f"must be one of {', '.join(STRATEGIES)} (got {self.strategy!r})")
        for name in ("reshard_after_forward", "checkpointing", "tie_weights", "first_step"):
            if not isinstance(getattr(self, name), bool):
                bad(name, f"must be True or False (got {getattr(self, name)!r})")
        if not self.reshard_after_forward and self.strategy != "fsdp2":
            bad("reshard_after_forward", "is FSDP2's: set strategy='fsdp2' or leave it True")
        _int_in("local_batch", self.local_batch, 1, MAX_TOKENS)
        _int_in("seq_len", self.seq_len, 1, MAX_TOKENS)
        if self.local_batch * self.seq_len > MAX_TOKENS:
            bad("seq_len", f"local_batch x seq_len = {self.local_batch * self.seq_len} tokens a rank; at most "
                           f"{MAX_TOKENS} are planned")
        if self.dtype not in PLAN_DTYPES:
            bad("dtype", f"must be one of {', '.join(PLAN_DTYPES)} (got {self.dtype!r})")
        if self.optimizer not in PLAN_OPTIMIZERS:
            bad("optimizer", f"must be one of {', '.join(PLAN_OPTIMIZERS)} (got {self.optimizer!r})")
        if self.foreach is not None and not isinstance(self.foreach, bool):
            bad("foreach", f"must be True, False or None (got {self.foreach!r})")
        cap = self.bucket_cap_mb
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float)) or not 0 < cap <= 1 << 20):
            bad("bucket_cap_mb", f"must be a positive number of MiB, or None (got {cap!r})")
        t = self.timeout_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t <= 3600:
            bad("timeout_s", f"must be a number of seconds in (0, 3600] (got {t!r})")

    def _check_sizes(self) -> None:
        from .experiment import Experiment

        try:
            Experiment(model=self.model, vocab_size=self.vocab_size, d_model=self.d_model, n_layers=self.n_layers,
                       n_heads=self.n_heads, tie_weights=self.tie_weights, seq_len=self.seq_len)
        except ValueError as e:
            raise ValueError(str(e).replace("Experiment.", "PlanSpec.", 1)) from None
        except TypeError as e:
            raise ValueError(f"PlanSpec: {e}") from None

    @property
    def hf_config(self) -> dict | None:
        """The Hugging Face config's fields for `hf:NAME`; None for other models (a path is read by the planner)."""
        return dict(HF_CONFIGS[self.model[3:]]) if self.model[3:] in HF_CONFIGS and self.model.startswith("hf:") \
            else None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, indent=1)

    @classmethod
    def from_dict(cls, d: dict) -> "PlanSpec":
        return cls(**only_fields(cls, d, "a plan spec"))

    def replace(self, **changes) -> "PlanSpec":
        return dataclasses.replace(self, **changes)
