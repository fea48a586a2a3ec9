"""The networks a run trains: built-in ones, or a user's own `nn.Module` factory.

Every model maps token ids of shape (batch, seq_len) to logits of shape (batch, seq_len,
vocab_size). `build(exp)` seeds the RNG first, so every rank builds bit-identical parameters
(DDP also broadcasts rank 0's copy at construction, but the lab checks both). Used by every notebook.

Built-in:
- "transformer": a small decoder-only transformer (token and position embeddings, pre-norm blocks
  of causal self-attention and an MLP, final norm, LM head; `tie_weights` shares embedding and head).
- "mlp": embedding, two hidden layers applied per token, LM head.
- "branchy": head defined first but used last, and two parallel branches (notebook 04).

A user's model: `model="package.module:factory"`; the factory is called with whichever of
`vocab_size, seq_len, d_model, n_layers, n_heads, tie_weights` it accepts as keyword arguments.
"""

from __future__ import annotations

import importlib
import inspect

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class HeadMajorAttention(nn.Module):
    """Causal self-attention whose fused q/k/v weight lists each head's q, k and v rows together
    (`layout="head-major"`, Megatron-LM's order), so a split of its rows into equal contiguous parts
    hands every part whole heads: what tensor parallelism needs (`rank/parallel/tensor.py`, notebook 09).
    `layout="qkv"` lists every q row, then k, then v, as `CausalSelfAttention` does: the same layer
    whole, but a contiguous split then cuts across q, k and v (notebook 09's mis-sharded layer). The
    forward counts its heads from the projection's width, so it runs whole and split alike."""

    LAYOUTS = ("head-major", "qkv")

    def __init__(self, d_model: int, n_heads: int, layout: str = "head-major"):
        super().__init__()
        if layout not in self.LAYOUTS:
            raise ValueError(f"layout must be one of {self.LAYOUTS} (got {layout!r})")
        self.head_dim, self.layout = d_model // n_heads, layout
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x):
        b, t, _ = x.shape
        qkv = self.qkv(x)
        heads = qkv.shape[-1] // (3 * self.head_dim)   # all of them whole, n_heads / tp on a tensor-parallel rank
        if self.layout == "head-major":
            q, k, v = qkv.view(b, t, heads, 3, self.head_dim).unbind(3)
        else:
            q, k, v = (z.view(b, t, heads, self.head_dim) for z in qkv.chunk(3, dim=-1))
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, heads * self.head_dim))


class HeadMajorBlock(nn.Module):
    """A pre-norm transformer block (as `Block`) built on `HeadMajorAttention`: the layer tensor
    parallelism splits whole (notebook 09)."""

    def __init__(self, d_model: int, n_heads: int, layout: str = "head-major"):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = HeadMajorAttention(d_model, n_heads, layout)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    bypass_mlp = False   # the "unused-parameter" fault (spec/fault.py): a forward that leaves the MLP out

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x if self.bypass_mlp else x + self.mlp(self.ln2(x))


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


def build(exp) -> nn.Module:
    """Build `exp.model` with the RNG seeded from `exp.seed` (identical on every rank)."""
    torch.manual_seed(exp.seed)
    sizes = dict(vocab_size=exp.vocab_size, seq_len=max(exp.seq_lens), d_model=exp.d_model,
                 n_layers=exp.n_layers, n_heads=exp.n_heads, tie_weights=exp.tie_weights)
    if exp.model == "transformer":
        return TinyTransformer(exp.vocab_size, sizes["seq_len"], exp.d_model, exp.n_layers, exp.n_heads,
                               exp.tie_weights, exp.checkpointing)
    if exp.model == "mlp":
        return TokenMLP(exp.vocab_size, exp.d_model, exp.n_layers)
    if exp.model == "branchy":
        return Branchy(exp.vocab_size, exp.d_model)
    factory = _load_factory(exp.model)
    try:
        accepted = inspect.signature(factory).parameters
    except (TypeError, ValueError):   # a builtin without a signature: call it with nothing
        accepted = {}
    try:
        model = factory(**{k: v for k, v in sizes.items() if k in accepted})
    except SystemExit as e:   # a factory that exits would end the launcher (or a rank) silently
        raise ValueError(f"Experiment.model: {exp.model} called sys.exit({e.code}) instead of returning a model") from None
    if not isinstance(model, nn.Module):
        raise ValueError(f"Experiment.model: {exp.model} returned {type(model).__name__}, not an nn.Module")
    return model


def check_model(model: nn.Module, exp) -> None:
    """Raise ValueError unless `model` maps (2, seq_len) token ids to (2, seq_len, vocab_size) logits."""
    seq_len = exp.seq_lens[0]
    with torch.no_grad():
        out = model(torch.zeros(2, seq_len, dtype=torch.long))
    want = (2, seq_len, exp.vocab_size)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != want:
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"Experiment.model: {exp.model} must map token ids (batch, seq_len) to logits "
                         f"(batch, seq_len, vocab_size) = {want}; it returned {got}")


def parameter_count(model: nn.Module) -> int:
    """Number of distinct parameter elements (a tied weight counts once)."""
    return sum(p.numel() for p in model.parameters())
