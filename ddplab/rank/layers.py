"""The layers the built-in transformer is made of (causal self-attention, a pre-norm block), and the
head-major variants tensor parallelism splits into whole heads (`rank/parallel/tensor_parallel.py`,
notebook 09). Runs inside a rank.
"""

from __future__ import annotations

import torch.nn as nn
import torch.nn.functional as F


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
    hands every part whole heads: what tensor parallelism needs (`rank/parallel/tensor_parallel.py`, notebook 09).
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
