"""Local, reduced and reference gradients, and how they compare.

In a rank (the gradients probe): `LocalGradients` sums, per parameter, the gradient each backward of
the step produces on this rank alone (a tensor hook, which sees the gradient before DDP's all-reduce
overwrites `.grad`); after the step's last backward, `.grad` holds the reduced gradient; rank 0
also computes the single-process reference on the whole global batch (`reference.py`).

In the notebook: `check(run)` and `check_case(run)` compare them (tables and plots show the rows),
and `rank_weights` is the pure model of how much each rank's examples count under each loss
normalization. Used by notebooks 01 and 06.
"""

from __future__ import annotations

import torch


class LocalGradients:
    """Sum of this rank's own gradient contributions per parameter, while `active`."""

    def __init__(self, module):
        self.active = False
        self.sums: dict[str, torch.Tensor] = {}
        self._handles = [p.register_hook(self._hook_for(name)) for name, p in module.named_parameters()]

    def _hook_for(self, name):
        def hook(grad):
            if self.active:
                g = grad.detach().cpu().clone()
                self.sums[name] = self.sums[name] + g if name in self.sums else g
            return grad
        return hook

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


def reduced(module) -> dict[str, torch.Tensor]:
    """Name -> the gradient left in `.grad` (after DDP's all-reduce), on the CPU."""
    return {n: p.grad.detach().cpu().clone() for n, p in module.named_parameters() if p.grad is not None}


# ---- analysis of a finished run (notebook side) ----------------------------------------------------

def _flat(d: dict[str, torch.Tensor], names: list[str]) -> torch.Tensor:
    return torch.cat([d[n].double().flatten() for n in names])


def load(run) -> list[dict]:
    """Each rank's saved gradients: {"local": {...}, "reduced": {...}} (+ "reference" on rank 0)."""
    tensors = [run.tensors(r.rank) for r in run.ranks]
    if "reference" not in tensors[0]:
        raise ValueError("this run has no gradients: run it with probes=('gradients',)")
    return tensors


def check(run) -> list[dict]:
    """One row per rank: relative error of its local and reduced gradient against the reference,
    the reduced gradient's largest absolute error, and whether every rank holds the same bits."""
    tensors = load(run)
    ref_d = tensors[0]["reference"]
    names = list(ref_d)
    ref = _flat(ref_d, names)
    reduced0 = _flat(tensors[0]["reduced"], names)
    identical = all(torch.equal(_flat(t["reduced"], names), reduced0) for t in tensors)
    rows = []
    for r, t in zip(run.ranks, tensors):
        local, red = _flat(t["local"], names), _flat(t["reduced"], names)
        rows.append({"rank": r.rank, "local_rel_error": float((local - ref).norm() / ref.norm()),
                     "reduced_rel_error": float((red - ref).norm() / ref.norm()),
                     "reduced_max_abs_error": float((red - ref).abs().max()),
                     "reduced_identical_on_all_ranks": identical})
    return rows


def check_case(run, names: list[str] | None = None, k: int = 3) -> list[dict]:
    """The first `k` elements of a few tensors: every rank's local value, their mean, the reduced
    value and the reference, side by side (default tensors: the first, a middle and the last)."""
    tensors = load(run)
    all_names = list(tensors[0]["reference"])
    names = names or [all_names[0], all_names[len(all_names) // 2], all_names[-1]]
    rows = []
    for name in names:
        locals_ = [t["local"][name].flatten()[:k].double() for t in tensors]
        mean = torch.stack(locals_).mean(0)
        for i in range(min(k, locals_[0].numel())):
            row = {"tensor": name, "element": i}
            row.update({f"local r{r}": float(v[i]) for r, v in enumerate(locals_)})
            row.update({"mean of locals": float(mean[i]),
                        "reduced": float(tensors[0]["reduced"][name].flatten()[i]),
                        "reference": float(tensors[0]["reference"][name].flatten()[i])})
            rows.append(row)
    return rows


def combine(run, weights: list[float]) -> dict[str, torch.Tensor]:
    """sum_r weights[r] * (rank r's local gradient): what a synchronization with these weights yields."""
    tensors = load(run)
    return {n: sum(w * t["local"][n].double() for w, t in zip(weights, tensors)) for n in tensors[0]["local"]}


def rank_weights(local_batches: list[int], seq_lens: list[int], loss_norm: str) -> list[float]:
    """How much rank r's local *mean* gradient counts in the synchronized gradient (pure).

    "rank-mean": every rank counts 1/world_size, whatever its size. The global objectives weight a
    rank by its share of the examples ("global-sample") or tokens ("global-token").
    """
    w = len(local_batches)
    if loss_norm == "rank-mean":
        return [1 / w] * w
    sizes = local_batches if loss_norm == "global-sample" else [b * s for b, s in zip(local_batches, seq_lens)]
    return [s / sum(sizes) for s in sizes]
