"""Exact fingerprints of tensors, equal on every rank exactly when the tensors are bit for bit equal
(but for a collision, which no realistic bug produces).

A float sum is no fingerprint: its order of additions depends on the thread count and the kernel, so
two equal tensors can sum to different last bits, and two ranks would disagree about equal replicas.
Here a tensor's bytes are read as integers (`Tensor.view`, no copy) and summed in int64, which is exact
and does not depend on the order. A parameter or a gradient gets two such sums, of its bytes read as
int32 words and as int64 words (int16 where the bytes do not divide into 8): one pass each, no copy,
so a check of a large model stays cheap; two replicas that drifted apart differ in both. A batch gets a sum that also depends on where each word sits (each
word times a different odd weight, wrapping modulo 2**64): two ranks' batches of token ids can hold the
same tokens in another order, and must not look alike.
"""

from __future__ import annotations

import math

import torch

CHUNK = 1 << 22   # words per int64 copy in a batch's fingerprint: 32 MiB
MASK = 2**64 - 1
GOLDEN = 0x9E3779B97F4A7C15 - 2**64   # odd, as a signed int64: the weights of a batch's words


def _bytes(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    if t.is_complex():
        t = torch.view_as_real(t)
    flat = t.contiguous().reshape(-1)
    return (flat.view(torch.uint8) if flat.dtype != torch.bool else flat.to(torch.uint8)).reshape(-1)


def _words(raw: torch.Tensor) -> torch.Tensor:
    """The bytes as int32 words where they divide into them, else as bytes."""
    return raw.view(torch.int32) if raw.numel() % 4 == 0 else raw


def tensor_fingerprint(t: torch.Tensor) -> list[int]:
    """[numel, sum of the int32 words, sum of the int64 words] of `t`'s bytes (exact; the second wraps)."""
    raw = _bytes(t)
    if raw.numel() % 2:
        return [t.numel(), int(raw.sum(dtype=torch.int64)), int((raw.to(torch.int64) ** 2).sum())]
    pairs = raw.view(torch.int64) if raw.numel() % 8 == 0 else raw.view(torch.int16)
    return [t.numel(), int(_words(raw).sum(dtype=torch.int64)), int(pairs.sum(dtype=torch.int64)) & MASK]


def ordered_fingerprint(t: torch.Tensor) -> list[int]:
    """[numel, sum of each word times an odd weight of its position] (int64, wrapping): a permutation
    of the same words gives another number."""
    words = _words(_bytes(t))
    total = 0
    for start in range(0, words.numel(), CHUNK):
        x = words[start:start + CHUNK].to(torch.int64)
        w = torch.arange(start, start + x.numel(), dtype=torch.int64, device=x.device) * GOLDEN + 1
        total += int((x * (w | 1)).sum())
    return [t.numel(), total & MASK]


def tensors_in(value, depth: int = 0):
    """Every tensor in a (nested) forward input: tuples, lists, dicts and objects with a `__dict__`
    (a Hugging Face BatchEncoding, a dataclass batch), in a fixed order."""
    if isinstance(value, torch.Tensor):
        yield value
    elif depth > 4:
        return
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from tensors_in(v, depth + 1)
    elif isinstance(value, dict):
        for k in sorted(value, key=str):
            yield from tensors_in(value[k], depth + 1)
    elif hasattr(value, "__dict__") and not isinstance(value, torch.nn.Module):
        yield from tensors_in(vars(value), depth + 1)


def batch_fingerprint(args: tuple, kwargs: dict) -> list[int] | None:
    """One position-sensitive fingerprint of every tensor a forward got (None if it got none)."""
    parts = [ordered_fingerprint(t) for t in tensors_in((args, kwargs))]
    if not parts:
        return None
    return [sum(p[0] for p in parts), sum(p[1] * (2 * i + 1) for i, p in enumerate(parts)) & MASK]


def loss_reduction(loss: torch.Tensor) -> tuple[str, float | None, float]:
    """(reduction, denominator, scale) of `loss`, read from its autograd graph: "mean" over `denominator`
    elements (`.mean()`; a loss function's reduction="mean", over the weight of the targets it did not
    ignore), "sum" of `denominator` elements, or "unknown"; times `scale`, the product of the constants
    it was then multiplied or divided by (gradient accumulation's `loss / steps`, a renormalization by a
    count the loop computed). A reduction over some dimensions only, or anything else, is "unknown"."""
    try:
        return _reduction(loss)
    except (AttributeError, RuntimeError, TypeError, ValueError):   # a node this torch keeps otherwise
        return "unknown", None, 1.0


def _reduction(loss: torch.Tensor) -> tuple[str, float | None, float]:
    node, scale = loss.grad_fn, 1.0
    for _ in range(16):
        if node is None:
            break
        name = node.name()
        reduction = getattr(node, "_saved_reduction", None)
        if name in ("MeanBackward0", "SumBackward0"):
            inner = [f.name() for f, _ in node.next_functions if f is not None]
            if any(n.startswith("MeanBackward") for n in inner):
                break   # a mean over some dimensions inside: its count is not in this node
            sizes = getattr(node, "_saved_self_sym_sizes", None)   # MeanBackward0 also keeps the numel; Sum only this
            return ("mean" if name == "MeanBackward0" else "sum"), float(math.prod(sizes)) if sizes else None, scale
        if reduction in (1, 2):
            total = getattr(node, "_saved_total_weight", None)   # nll_loss: the targets' weight, ignored ones left out
            count = float(total) if isinstance(total, torch.Tensor) else float(node._saved_self.numel())
            return ("mean" if reduction == 1 else "sum"), count, scale
        grads = [f for f, _ in node.next_functions]
        if name in ("DivBackward0", "MulBackward0") and len(grads) == 2 and (grads[0] is None) != (grads[1] is None):
            const = node._saved_other if grads[0] is not None else node._saved_self
            if not isinstance(const, torch.Tensor) or const.numel() != 1 or (name == "DivBackward0" and grads[0] is None):
                break
            scale = scale / float(const) if name == "DivBackward0" else scale * float(const)
            node = grads[0] if grads[0] is not None else grads[1]
            continue
        if len(grads) == 1 and name.startswith(("ViewBackward", "SqueezeBackward", "CloneBackward", "ToCopyBackward",
                                                 "UnsqueezeBackward", "ReshapeAliasBackward")):
            node = grads[0]
            continue
        break
    return "unknown", None, scale
