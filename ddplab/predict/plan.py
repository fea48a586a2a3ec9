"""A step-time estimate for a plan on a named cluster: an estimate, never a measurement (pure: no torch).

    estimate = step_estimate(flops, collectives, buckets_bytes, world_size, strategy, CLUSTERS["h100-ib"])

Three parts, each with its assumption beside it (`StepEstimate.assumptions`):
- compute: the FLOPs torch counted for rank 0's forward and backward (`FlopCounterMode`, in the plan) over the
  device's dense peak for the plan's dtype (BF16, or TF32 for float32) times a model FLOPs utilisation (MFU),
  a range from published runs;
- communication: each collective on an alpha-beta line, `count x latency + wire bytes / bus bandwidth`, where
  the wire bytes are the ring's share the plan gives and the bus bandwidth is nccl-tests' figure (a range:
  what a healthy cluster reaches, and what a report measured);
- overlap: DDP's buckets as chapter 05 models them (`predict/buckets.py` `simulate`, the textbook's perfect
  overlap: each bucket launched once its gradients are ready, spread evenly over backward, backward two thirds
  of the compute); ZeRO-1's broadcasts after the step, not overlapped; FSDP2's gathers and reduce-scatters
  hidden behind compute at best (prefetch), added to it at worst.
The figures and their sources: docs/performance-anchors.md. Used by notebook 12 and `ddplab plan`.
"""

from __future__ import annotations

from dataclasses import dataclass

from .buckets import Cost, Grad, simulate
from .comm import AlphaBeta

BACKWARD_SHARE = 2 / 3   # backward does twice the forward's matrix work: 2/3 of a step's FLOPs
H100 = {"bfloat16": 989.0, "float32": 495.0}   # dense tensor-core TFLOPS; float32 matmuls run as TF32
H100_FP32_TFLOPS = 67.0   # float32 without tensor cores: torch's default precision for float32 matmuls
# what the float32 peak assumes: torch runs float32 matmuls as TF32 only when asked to
# (tests/predict/test_plan.py reads torch's default)
PEAK_NOTE = {"float32": f"as TF32, which torch does after torch.set_float32_matmul_precision('high'); at its default "
                        f"('highest') an H100 runs float32 at {H100_FP32_TFLOPS:g} TFLOPS, "
                        f"{H100['float32'] / H100_FP32_TFLOPS:.0f}x slower"}


def peak_label(dtype: str, tflops: float) -> str:
    """A peak as the estimate prints it: '989 TFLOPS (bfloat16)', with what a float32 peak assumes."""
    note = PEAK_NOTE.get(dtype)
    return f"{tflops:g} TFLOPS ({dtype}{' ' + note if note else ''})"


@dataclass(frozen=True)
class Cluster:
    """A cluster's published figures, each a (fast, slow) pair, and where they come from."""

    name: str
    peak_tflops: dict                   # one device's dense peak by the plan's dtype (float32 runs as TF32)
    mfu: tuple[float, float]            # model FLOPs utilisation (the share of the peak) large BF16 runs reach
    busbw_gb_s: tuple[float, float]     # all-reduce bus bandwidth (nccl-tests), GB/s
    latency_us: tuple[float, float]     # a collective's fixed cost
    sources: str
    max_ranks: int = 1 << 20            # devices the cluster has (one node: 8)


CLUSTERS = {
    "h100-node": Cluster("8 x H100 SXM, one node, NVLink 4", H100, (0.43, 0.38), (480.0, 370.0), (6.0, 20.0),
                         "H100 datasheet (989 dense BF16, 495 dense TF32, 67 FP32 TFLOPS); NVLink all-reduce busbw 370 GB/s (ring) to "
                         "480 GB/s (NVLS), nccl-tests#212; latency 6-20 us; MFU 38-43%, Llama 3 on H100s", max_ranks=8),
    "h100-ib": Cluster("H100 SXM nodes, 8 x 400 Gb/s NICs each", H100, (0.43, 0.38), (470.0, 220.0), (20.0, 50.0),
                       "H100 datasheet (989 dense BF16, 495 dense TF32, 67 FP32 TFLOPS); across nodes 470 GB/s expected (above what eight "
                       "50 GB/s NICs carry without in-network reduction) and 220 GB/s measured on an underperforming "
                       "RoCE cluster, nccl#2409; latency 20-50 us a collective at any size, nccl#757 and nccl#1244; MFU 38-43%, "
                       "Llama 3 on H100s"),
}


@dataclass(frozen=True)
class StepEstimate:
    """Seconds of one step, fast and slow ends of the range, by part; and the assumptions behind them."""

    compute_s: tuple[float, float]
    comm_s: tuple[float, float]
    step_s: tuple[float, float]
    assumptions: tuple[str, ...]


def comm_seconds(collectives, busbw_bytes_per_s: float, latency_s: float) -> float:
    """Every collective alone, one after another: count x latency + the ring's wire bytes / bus bandwidth."""
    return sum(c.count * latency_s + c.wire_bytes / busbw_bytes_per_s for c in collectives)


def _ddp_step_s(compute_s: float, buckets_bytes: list[int], world_size: int, busbw: float, latency_s: float) -> float:
    """Chapter 05's model: buckets launched as their gradients are ready, evenly over backward, one channel."""
    if not buckets_bytes or world_size < 2:
        return compute_s
    backward_ms = compute_s * BACKWARD_SHARE * 1e3
    n = len(buckets_bytes)
    grads = [Grad(f"bucket{i}", b, backward_ms * (i + 1) / n) for i, b in enumerate(buckets_bytes)]
    share = 2 * (world_size - 1) / world_size
    cost = Cost(AlphaBeta(latency_s, share / busbw))
    schedule = simulate(grads, [[g.name] for g in grads], cost, backward_ms,
                        forward_ms=compute_s * (1 - BACKWARD_SHARE) * 1e3)
    return schedule.step_ms / 1e3


def step_estimate(flops: int, collectives, buckets_bytes: list[int], world_size: int, strategy: str,
                  cluster: Cluster, dtype: str = "bfloat16") -> StepEstimate:
    """The step's time on `cluster`, as a (fast, slow) range, for a plan in `dtype`."""
    if flops < 0 or world_size < 1:
        raise ValueError("flops must be >= 0 and world_size >= 1")
    if dtype not in cluster.peak_tflops:
        raise ValueError(f"dtype: must be one of {', '.join(cluster.peak_tflops)} (got {dtype!r})")
    peak = cluster.peak_tflops[dtype]
    compute = tuple(flops / (peak * 1e12 * m) for m in cluster.mfu)
    comm = tuple(comm_seconds(collectives, bw * 1e9, lat * 1e-6)
                 for bw, lat in zip(cluster.busbw_gb_s, cluster.latency_us))
    if strategy in ("ddp", "zero1"):
        steps = []
        for c, m, bw, lat in zip(compute, comm, cluster.busbw_gb_s, cluster.latency_us):
            reduce = [x for x in collectives if x.op == "all_reduce"]
            after = m - comm_seconds(reduce, bw * 1e9, lat * 1e-6)   # ZeRO-1's broadcasts, after the step
            steps.append(_ddp_step_s(c, buckets_bytes, world_size, bw * 1e9, lat * 1e-6) + after)
    else:   # FSDP2: hidden behind compute at best (fast end), added to it at worst (slow end)
        steps = [max(compute[0], comm[0]), compute[1] + comm[1]]
    assumptions = (
        f"cluster: {cluster.name} ({cluster.sources})",
        f"compute: {flops / 1e12:.3g} TFLOP a rank (FlopCounterMode) at {peak_label(dtype, peak)} x MFU "
        f"{cluster.mfu[0]:.0%} (fast) / {cluster.mfu[1]:.0%} (slow)",
        f"communication: bus bandwidth {cluster.busbw_gb_s[0]:g} / {cluster.busbw_gb_s[1]:g} GB/s, "
        f"{cluster.latency_us[0]:g} / {cluster.latency_us[1]:g} us a collective",
        f"overlap ({strategy}): " + ("buckets overlap backward as chapter 05 models them (textbook: no interference)"
                                     + ("; the broadcasts after the step, not overlapped" if strategy == "zero1" else "")
                                     if strategy in ("ddp", "zero1") else
                                     "collectives hidden behind compute (fast end) or added to it (slow end)"),
    )
    return StepEstimate(compute, comm, (steps[0], steps[1]), assumptions)


# Bytes one rank sends for a payload of P bytes on a ring of D ranks (chapter 03), as a multiple of (D-1)/D P:
# all-reduce 2; all-gather and reduce-scatter 1 (P: the whole gathered or scattered tensor); broadcast, as a
# chain, 1 on average over the ranks. NCCL's ring: the plan's `Collective.wire_bytes` (rank/probes/collectives.py).
RING_WIRE = {"all_reduce": 2.0, "all_gather": 1.0, "reduce_scatter": 1.0, "broadcast": 1.0}

# What one rank writes on gloo (one host) for a payload of P bytes on D ranks, as a multiple of (D-1)/D P,
# measured with /proc/self/io: all-reduce 2 and all-gather 1, as the ring; reduce-scatter 2, because gloo
# runs it as a whole all-reduce (where NCCL's ring sends 1); broadcast a binomial tree, 1 on average over the
# ranks (the root sends log2(D) P). The plan's `wire_bytes` price NCCL's ring; these price the lab's gloo runs.
GLOO_WIRE = {"all_reduce": 2.0, "all_gather": 1.0, "reduce_scatter": 2.0, "broadcast": 1.0}


def gloo_wire_bytes(collectives, world_size: int) -> int:
    """Bytes a rank writes for the plan's `collectives` on gloo, averaged over the ranks (`GLOO_WIRE`)."""
    unknown = sorted({c.op for c in collectives} - set(GLOO_WIRE))
    if unknown:
        raise ValueError(f"collectives: no gloo price for {', '.join(unknown)}")
    share = (world_size - 1) / world_size
    return round(sum(GLOO_WIRE[c.op] * share * c.payload_bytes for c in collectives))
