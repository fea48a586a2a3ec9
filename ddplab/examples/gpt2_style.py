"""A GPT-2-style network for the practice exercise, written as a user's model factory
(`model="ddplab.examples.gpt2_style:gpt2"`): GPT-2's layout and parameter names (`wte`, `wpe`, blocks of `ln_1`, `attn.c_attn`
(query, key and value in one matrix), `attn.c_proj`, `ln_2`, `mlp.c_fc`, `mlp.c_proj`, then `ln_f`
and an LM head tied to `wte`), at any size. Plain torch, so it runs wherever ddplab does; any other
factory that returns an `nn.Module` mapping token ids to logits is audited the same way.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.c_attn = nn.Linear(d_model, 3 * d_model)
        self.c_proj = nn.Linear(d_model, d_model)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_heads, c // self.n_heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, c))


class MLP(nn.Module):
    def __init__(self, d_model: int):
        super().__init__()
        self.c_fc = nn.Linear(d_model, 4 * d_model)
        self.c_proj = nn.Linear(4 * d_model, d_model)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(d_model), Attention(d_model, n_heads)
        self.ln_2, self.mlp = nn.LayerNorm(d_model), MLP(d_model)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2Style(nn.Module):
    def __init__(self, vocab_size: int, seq_len: int, d_model: int, n_layers: int, n_heads: int):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, d_model)
        self.wpe = nn.Embedding(seq_len, d_model)
        self.h = nn.ModuleList(Block(d_model, n_heads) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight   # tied, as in GPT-2: one parameter, two uses

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def gpt2(vocab_size: int, seq_len: int, d_model: int, n_layers: int, n_heads: int) -> nn.Module:
    """GPT-2's architecture at the experiment's sizes (GPT-2 small is 50257, 1024, 768, 12, 12)."""
    return GPT2Style(vocab_size, seq_len, d_model, n_layers, n_heads)
