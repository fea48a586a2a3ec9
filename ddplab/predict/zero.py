"""ZeRO's per-device model-state memory, stage 0 to 3, from a parameter count and a device count (pure).

The ZeRO paper's accounting (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models", 2020, section 5 and figure 1), for Psi parameters on N data-parallel devices:

    mixed precision, Adam:  2 bytes of bf16/fp16 parameters, 2 of gradients, and K = 12 bytes of fp32
                            state per parameter (a master copy of the parameters, momentum, variance)
    stage 0 (replicated)    (2 + 2 + K) Psi          every device holds everything
    stage 1 (P_os)          (2 + 2) Psi + K Psi / N  the optimizer state is sharded
    stage 2 (P_os+g)        2 Psi + (2 + K) Psi / N  ... and the gradients
    stage 3 (P_os+g+p)      (2 + 2 + K) Psi / N      ... and the parameters (what FSDP does)

Plain fp32 training with Adam has no master copy: 4 bytes of parameters, 4 of gradients and K = 8 of
state (momentum, variance). Activations, temporary buffers and the parameters a ZeRO-3 / FSDP device
gathers for one layer at a time are not model state and are not here (`predict/fsdp_memory.py` adds them).

With the paper's 7.5 B parameters on 64 devices: 120, 31.4, 16.6 and 1.9 GB (GB = 10**9 bytes).
`zero_stages(psi, n_devices)` is the call a learner makes with their own model size. For a real model
ZeRO-1 is exact only with the framework's partition rule: torch's `ZeroRedundancyOptimizer` gives whole
parameter tensors to ranks (`predict.memory.zero1_owners`), so ranks differ; `zero1_exact` says by how
much. `zero1_step_bytes` is ZeRO-1's traffic in torch: the optimizer step's broadcasts, beside DDP's
all-reduce, which ZeRO-1 keeps. Used by notebooks 02 and 09.
"""

from __future__ import annotations

import math

from .comm import ring_bytes_per_rank
from .memory import zero1_owners

STAGES = (0, 1, 2, 3)
# bytes per parameter: (parameters, gradients, optimizer state K)
PRECISIONS = {"mixed": (2, 2, 12), "fp32": (4, 4, 8)}
GB = 10 ** 9


def _check(psi, n_devices, precision) -> None:
    if isinstance(psi, bool) or not isinstance(psi, (int, float)) or not psi > 0 or not math.isfinite(psi):
        raise ValueError(f"psi: the parameter count must be a positive, finite number (got {psi!r})")
    if isinstance(n_devices, bool) or not isinstance(n_devices, int) or n_devices < 1:
        raise ValueError(f"n_devices: must be a positive integer (got {n_devices!r})")
    if precision not in PRECISIONS:
        raise ValueError(f"precision: must be one of {', '.join(PRECISIONS)} (got {precision!r})")


def zero_state_bytes(psi: float, n_devices: int, stage: int, precision: str = "mixed") -> dict[str, float]:
    """Model-state bytes on one device under ZeRO `stage`: parameters, gradients, optimizer_state, total."""
    _check(psi, n_devices, precision)
    if stage not in STAGES:
        raise ValueError(f"stage: must be one of 0, 1, 2, 3 (got {stage!r})")
    p, g, k = PRECISIONS[precision]
    n = n_devices
    row = {"parameters": p * psi / (n if stage >= 3 else 1),
           "gradients": g * psi / (n if stage >= 2 else 1),
           "optimizer_state": k * psi / (n if stage >= 1 else 1)}
    row["total"] = sum(row.values())
    return row


def zero_stages(psi: float, n_devices: int, precision: str = "mixed") -> dict[str, list]:
    """Stage 0..3 side by side for `psi` parameters on `n_devices`: a dict of columns (one row per
    stage) that `pandas.DataFrame(...)` shows as a table: per-device bytes of each part and in all,
    the total in GB (10**9 bytes), and how many times less than replicated."""
    rows = [zero_state_bytes(psi, n_devices, s, precision) for s in STAGES]
    replicated = rows[0]["total"]
    return {"stage": list(STAGES),
            "sharded": ["nothing (replicated)", "optimizer state", "optimizer state, gradients",
                        "optimizer state, gradients, parameters"],
            "parameters_bytes": [r["parameters"] for r in rows],
            "gradients_bytes": [r["gradients"] for r in rows],
            "optimizer_state_bytes": [r["optimizer_state"] for r in rows],
            "total_bytes": [r["total"] for r in rows],
            "total_gb": [r["total"] / GB for r in rows],
            "reduction": [replicated / r["total"] for r in rows]}


def zero1_exact(numels: list[int], world_size: int, state_bytes_per_element: int = 8,
                per_tensor_bytes: int = 4) -> list[int]:
    """Optimizer-state bytes on each rank under torch's ZeRO-1 for these parameter tensors (one entry per
    rank): each tensor's state lives whole on the rank `zero1_owners` gives it. Defaults: fp32 Adam
    (8 bytes per element, two moments, and a 4-byte `step` per tensor). The even split `K Psi / N` is
    their mean; the largest entry is what the busiest rank must hold."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size: must be a positive integer (got {world_size!r})")
    if not isinstance(numels, (list, tuple)):
        raise ValueError(f"numels: a list of every parameter tensor's element count (got {numels!r})")
    numels = list(numels)
    bad = [n for n in numels if isinstance(n, bool) or not isinstance(n, int) or n < 0]
    if not numels or bad:
        raise ValueError(f"numels: every parameter tensor's element count, non-negative integers, at least one "
                         f"(got {'nothing' if not numels else 'e.g. ' + repr(bad[0])})")
    for name, v in (("state_bytes_per_element", state_bytes_per_element), ("per_tensor_bytes", per_tensor_bytes)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{name}: a non-negative integer (got {v!r})")
    per_rank = [0] * world_size
    for n, owner in zip(numels, zero1_owners(numels, world_size)):
        per_rank[owner] += n * state_bytes_per_element + per_tensor_bytes
    return per_rank


def zero1_step_bytes(parameter_bytes: int, world_size: int) -> dict[str, float]:
    """What torch's ZeRO-1 (`ZeroRedundancyOptimizer` around a DDP model) sends per step, summed over the
    ranks, in bytes: DDP's ring all-reduce of the gradients, 2(D-1)/D x G on each rank, unchanged; then
    `step()` broadcasts every rank's updated shard to the others, so each byte of the parameters reaches
    D - 1 ranks once: (D - 1) x P in all, whatever tree the broadcast uses. Per rank on average that is
    (D - 1)/D x P, half the all-reduce's when P = G (fp32 gradients): ZeRO-1 in torch sends 1.5x DDP's
    bytes, where the ZeRO paper's reduce-scatter + all-gather keeps DDP's 2(D-1)/D x G."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size: must be a positive integer (got {world_size!r})")
    if not parameter_bytes > 0:
        raise ValueError(f"parameter_bytes: the model's parameter bytes, positive (got {parameter_bytes!r})")
    all_reduce = world_size * ring_bytes_per_rank(parameter_bytes, world_size)
    broadcast = (world_size - 1) * parameter_bytes
    return {"all_reduce": all_reduce, "broadcast": broadcast, "over_ddp": (all_reduce + broadcast) / all_reduce
            if all_reduce else math.nan}
