"""The networks a run trains: built-in ones, or a user's own `nn.Module` factory.

Every model maps token ids of shape (batch, seq_len) to logits of shape (batch, seq_len,
vocab_size). `build(exp)` seeds the RNG first, so every rank builds bit-identical parameters
(DDP also broadcasts rank 0's copy at construction, but the lab checks both). Used by every notebook.

Built-in:
- "transformer": a small decoder-only transformer (token and position embeddings, pre-norm blocks
  of causal self-attention and an MLP, final norm, LM head; `tie_weights` shares embedding and head).
- "mlp": embedding, two hidden layers applied per token, LM head.
- "branchy": head defined first but used last, and two parallel branches (notebook 04).

A user's model: `model="package.module:factory"`, called with whichever of `vocab_size, seq_len,
d_model, n_layers, n_heads, tie_weights` it accepts; it returns a module that takes token ids, or a
`ModelWithData` with its own examples (the contract: spec/model.py).
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from ..spec.model import ModelWithData
from . import data
from .layers import Block


class TinyTransformer(nn.Module):
    """Decoder-only transformer; `tie_weights=True` makes the LM head reuse the token embedding;
    `checkpointing=True` recomputes each block's activations during backward instead of saving them."""

    def __init__(self, vocab_size: int, max_seq_len: int, d_model: int, n_layers: int, n_heads: int,
                 tie_weights: bool = False, checkpointing: bool = False):
        super().__init__()
        self.checkpointing = checkpointing
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(max_seq_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        if tie_weights:
            self.head.weight = self.tok_emb.weight  # one Parameter, listed once by parameters()

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.checkpointing else block(x)
        return self.head(self.ln_f(x))


class TokenMLP(nn.Module):
    """Embedding, an MLP applied to every token independently, LM head."""

    def __init__(self, vocab_size: int, d_model: int, n_layers: int):
        super().__init__()
        self.emb = nn.Embedding(vocab_size, d_model)
        layers = []
        for _ in range(n_layers):
            layers += [nn.Linear(d_model, d_model), nn.ReLU()]
        self.hidden = nn.Sequential(*layers)
        self.head = nn.Linear(d_model, vocab_size)

    def forward(self, idx):
        return self.head(self.hidden(self.emb(idx)))


class Branchy(nn.Module):
    """A model whose gradient-ready order is not its source order: the head is defined first but used
    last, and the middle splits into two parallel branches that are multiplied back together."""

    def __init__(self, vocab_size: int, d_model: int):
        super().__init__()
        self.head = nn.Linear(d_model, vocab_size)   # defined first, used last
        self.emb = nn.Embedding(vocab_size, d_model)
        self.a = nn.Linear(d_model, d_model)
        self.b1 = nn.Linear(d_model, d_model)        # branch 1
        self.b2 = nn.Linear(d_model, d_model)        # branch 2, a gate on branch 1
        self.c = nn.Linear(d_model, d_model)

    def forward(self, idx):
        h = torch.relu(self.a(self.emb(idx)))
        h = self.b1(h) * torch.sigmoid(self.b2(h))
        return self.head(torch.relu(self.c(h)))


def _load_factory(path: str):
    module_name, attr = path.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"Experiment.model: cannot import module {module_name!r} ({e})") from e
    if not hasattr(module, attr):
        raise ValueError(f"Experiment.model: module {module_name!r} has no attribute {attr!r}")
    return getattr(module, attr)


@dataclass(frozen=True)
class Built:
    """A built network and the examples it takes: `batch(sample_ids, seq_len) -> (inputs, targets)`;
    `own_data`: the user's factory supplied them (`ModelWithData`), else the lab's synthetic tokens."""

    module: nn.Module
    batch: Callable
    own_data: bool = False


def build(exp) -> nn.Module:
    """Build `exp.model` with the RNG seeded from `exp.seed` (identical on every rank); it takes token
    ids. For a task that feeds the lab's own tokens: a factory with its own data is refused."""
    built = build_with_data(exp)
    if built.own_data:
        raise ValueError(f"Experiment.model: {exp.model} returns a ModelWithData (inputs of its own), and the "
                         f"{exp.task.kind} task feeds token ids; use a factory returning a plain nn.Module here")
    return built.module


def build_with_data(exp, data_of=None) -> Built:
    """Build `exp.model` (seeded from `exp.seed`) with the examples it takes (spec/model.py), drawn
    with `data_of`'s seed and vocabulary (default `exp`'s: a rank that builds from its own seed still
    trains on the run's examples)."""
    torch.manual_seed(exp.seed)
    sizes = dict(vocab_size=exp.vocab_size, seq_len=max(exp.seq_lens), d_model=exp.d_model,
                 n_layers=exp.n_layers, n_heads=exp.n_heads, tie_weights=exp.tie_weights)
    data_of = data_of or exp

    def tokens(ids, seq_len):
        return data.batch(data_of.seed, ids, seq_len, data_of.vocab_size)

    if exp.model == "transformer":
        return Built(TinyTransformer(exp.vocab_size, sizes["seq_len"], exp.d_model, exp.n_layers, exp.n_heads,
                                     exp.tie_weights, exp.checkpointing), tokens)
    if exp.model == "mlp":
        return Built(TokenMLP(exp.vocab_size, exp.d_model, exp.n_layers), tokens)
    if exp.model == "branchy":
        return Built(Branchy(exp.vocab_size, exp.d_model), tokens)
    factory = _load_factory(exp.model)
    try:
        accepted = inspect.signature(factory).parameters
    except (TypeError, ValueError):   # a builtin without a signature: call it with nothing
        accepted = {}
    try:
        made = factory(**{k: v for k, v in sizes.items() if k in accepted})
    except SystemExit as e:   # a factory that exits would end the launcher (or a rank) silently
        raise ValueError(f"Experiment.model: {exp.model} called sys.exit({e.code}) instead of returning a model") from None
    if isinstance(made, ModelWithData):
        module, seed = made.model, data_of.seed
        batch, own = (lambda ids, seq_len: made.batch(list(ids), seed)), True
    else:
        module, batch, own = made, tokens, False
    if not isinstance(module, nn.Module):
        raise ValueError(f"Experiment.model: {exp.model} returned {type(module).__name__}, not an nn.Module "
                         f"(or a ModelWithData holding one)")
    module.register_forward_hook(_logits_of)   # a Hugging Face output: its .logits
    return Built(module, batch, own)


def _logits_of(module, args, out):
    """A forward hook: an output that carries `.logits` (a Hugging Face ModelOutput) or a "logits" key
    becomes the logits."""
    logits = out.get("logits") if isinstance(out, dict) else getattr(out, "logits", None)
    return logits if isinstance(logits, torch.Tensor) else None


def check_model(model: nn.Module, exp, batch: Callable | None = None) -> None:
    """Raise ValueError unless `model` maps two examples (`batch`, default the lab's tokens) to logits
    of shape targets.shape + (classes,) with every target a valid class."""
    seq_len = exp.seq_lens[0]
    if batch is None:
        x, y = torch.zeros(2, seq_len, dtype=torch.long), torch.zeros(2, seq_len, dtype=torch.long)
        want, what = (2, seq_len, exp.vocab_size), "token ids (batch, seq_len) to logits (batch, seq_len, vocab_size)"
    else:
        x, y = _user_batch(batch, exp, seq_len)
        want, what = None, "its inputs to logits of shape targets.shape + (classes,)"
    with torch.no_grad():
        try:
            out = model(x)
        except Exception as e:
            raise ValueError(f"Experiment.model: {exp.model}'s forward raised {type(e).__name__}: {e}") from e
    shape = tuple(out.shape) if isinstance(out, torch.Tensor) else None
    ok = shape is not None and (shape == want if want else
                                len(shape) == y.dim() + 1 and shape[:-1] == tuple(y.shape) and shape[-1] >= 2)
    if not ok:
        got = shape if shape is not None else type(out).__name__
        need = want or f"{tuple(y.shape)} + (classes,)"
        hint = ("; return the logits tensor itself, or an object with a .logits tensor (a Hugging Face model with "
                "return_dict=True)") if shape is None else ""
        raise ValueError(f"Experiment.model: {exp.model} must map {what} = {need}; it returned {got}{hint}")
    if not out.is_floating_point():
        raise ValueError(f"Experiment.model: {exp.model} returned {out.dtype} logits; cross-entropy needs floating-"
                         f"point logits (return the scores, not their argmax)")
    if not torch.isfinite(out).all():
        raise ValueError(f"Experiment.model: {exp.model} returned logits that are NaN or infinite on two examples "
                         f"before any training; check its initialization and forward")
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError(f"Experiment.model: {exp.model} has no trainable parameter (none, or every one has "
                         f"requires_grad=False): DDP would have nothing to synchronize")
    if batch is not None and not (0 <= int(y.min()) and int(y.max()) < shape[-1]):
        raise ValueError(f"Experiment.model: {exp.model}'s targets must be class ids in 0..{shape[-1] - 1} "
                         f"(the logits' last dimension); its batch gave {int(y.min())}..{int(y.max())}")


def saved_bytes_per_example(model: nn.Module, exp, batch: Callable | None = None) -> int:
    """Bytes autograd saves for backward, per example, measured on one forward of two examples (the
    lab's tokens at the longest seq_len, or the factory's own `batch`): what a rank's activations grow
    by per example, for a model whose shapes the lab cannot count. The loss counts too (cross-entropy
    saves its log-softmax, the logits' size: for a small model with a wide head, as much as the model
    saves). Parameters saved for backward are not activations and are left out; a tensor saved twice
    counts once."""
    from .training import token_losses

    if batch is None:
        x = torch.zeros(2, max(exp.seq_lens), dtype=torch.long)
        y = torch.zeros_like(x)
    else:
        x, y = _user_batch(batch, exp, max(exp.seq_lens))
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen, total = set(), 0

    def pack(t):
        nonlocal total
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params and ptr not in seen:
            seen.add(ptr)
            total += t.untyped_storage().nbytes()
        return t

    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        losses = token_losses(model(x), y)
        del losses
    return total // 2


def _user_batch(batch: Callable, exp, seq_len: int):
    try:
        got = batch([0, 1], seq_len)
    except Exception as e:
        raise ValueError(f"Experiment.model: {exp.model}'s batch(sample_ids, seed) raised {type(e).__name__}: {e}") from e
    if not (isinstance(got, tuple) and len(got) == 2 and all(isinstance(t, torch.Tensor) for t in got)):
        raise ValueError(f"Experiment.model: {exp.model}'s batch(sample_ids, seed) must return (inputs, targets), "
                         f"two tensors; it returned {type(got).__name__}")
    x, y = got
    if y.dtype not in (torch.long, torch.int32, torch.int64) or y.dim() < 1 or y.shape[0] != 2 or x.shape[0] != 2:
        raise ValueError(f"Experiment.model: {exp.model}'s batch for 2 sample ids must give inputs and integer "
                         f"targets with 2 rows; it gave inputs {tuple(x.shape)}, targets {tuple(y.shape)} {y.dtype}")
    return x, y


def unused_parameters(model: nn.Module, exp, batch: Callable) -> list[str]:
    """Trainable parameters left without a gradient by one forward and backward on two examples of
    `batch` (`Built.batch`)."""
    from .training import token_losses

    x, y = _user_batch(batch, exp, exp.seq_lens[0])
    model.zero_grad(set_to_none=True)
    token_losses(model(x), y).mean().backward()
    names = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    model.zero_grad(set_to_none=True)
    return names


def parameter_count(model: nn.Module) -> int:
    """Number of distinct parameter elements (a tied weight counts once)."""
    return sum(p.numel() for p in model.parameters())
