"""What tensor parallelism communicates, per layer and step, beside DDP (pure: numbers in, numbers out).

Megatron-LM's split of a transformer sublayer (an MLP, or attention) over p ranks costs:
- forward: one all-reduce of the sublayer's output, batch x seq_len x d_model elements: the row-parallel
  Linear leaves each rank a partial sum;
- backward: one all-reduce of the same size, summing the input's gradient from the column-parallel
  Linear, when anything before the sublayer needs that gradient (the layer's input, or the LayerNorm
  in front of each sublayer of a block). A first layer fed plain data skips it.
Every all-reduce of N bytes on a ring sends 2(p-1)/p x N bytes per rank (`predict.comm`). DDP of the
same layer instead all-reduces its gradients, parameters x element bytes, once per step, and can
overlap that with backward; tensor parallelism's all-reduces stand between two ops and cannot.
Parameter counts are the lab's own layers (`rank/parallel/tensor_parallel.py`): Linear(d, 4d) and Linear(4d, d)
for the MLP, the fused Linear(d, 3d) and Linear(d, d) for attention, two LayerNorms more in a block;
the row-parallel Linear's bias and the LayerNorms are replicated on every rank.
Used by notebook 09, beside `tables/tensor_parallel.py`; tests check it against real runs.
Reference: Shoeybi et al., "Megatron-LM" (2019), section 3, https://arxiv.org/abs/1909.08053
"""

from __future__ import annotations

from .comm import ring_bytes_per_rank

SUBLAYERS = {"mlp": 1, "attention": 1, "attention-qkv-split": 1, "block": 2}
_NORMED = {"block"}   # a LayerNorm with parameters in front of every sublayer


def _known(layer: str) -> None:
    if layer not in SUBLAYERS:
        raise ValueError(f"layer must be one of {', '.join(SUBLAYERS)} (got {layer!r})")


def all_reduces(layer: str, input_needs_grad: bool = True) -> dict[str, int]:
    """Tensor parallelism's all-reduces per step: {"forward": n, "backward": m}."""
    _known(layer)
    n = SUBLAYERS[layer]
    return {"forward": n, "backward": n if input_needs_grad or layer in _NORMED else 0}


def activation_bytes(local_batch: int, seq_len: int, d_model: int, element_bytes: int = 4) -> int:
    """One tensor-parallel all-reduce: the sublayer's output (or input gradient), b x t x d elements."""
    return local_batch * seq_len * d_model * element_bytes


def params(layer: str, d_model: int) -> int:
    """Parameter elements of the dense layer."""
    _known(layer)
    d = d_model
    mlp, attention, norms = 8 * d * d + 5 * d, 4 * d * d + 4 * d, 4 * d
    return {"mlp": mlp, "block": mlp + attention + norms}.get(layer, attention)


def local_params(layer: str, d_model: int, tp: int) -> int:
    """Parameter elements one rank holds of the layer split over `tp` ranks: the split weights and
    column-parallel biases divided by tp, the row-parallel bias and any LayerNorm whole."""
    _known(layer)
    d = d_model
    mlp = (8 * d * d + 4 * d) // tp + d
    attention = (4 * d * d + 3 * d) // tp + d
    return {"mlp": mlp, "block": mlp + attention + 4 * d}.get(layer, attention)


def ddp_gradient_bytes(layer: str, d_model: int, element_bytes: int = 4) -> int:
    """DDP's gradient all-reduce of the whole layer, per step (in however many buckets)."""
    return params(layer, d_model) * element_bytes


def step_comm(layer: str, local_batch: int, seq_len: int, d_model: int, tp: int, input_needs_grad: bool = True,
              element_bytes: int = 4) -> dict:
    """Per step of one layer: tensor parallelism's all-reduces and bytes (message and ring bytes per
    rank), beside DDP's gradient all-reduce over as many ranks (each 1/tp of the batch)."""
    counts = all_reduces(layer, input_needs_grad)
    message = activation_bytes(local_batch, seq_len, d_model, element_bytes)
    calls = counts["forward"] + counts["backward"]
    ddp = ddp_gradient_bytes(layer, d_model, element_bytes)
    return {"tp_forward_all_reduces": counts["forward"], "tp_backward_all_reduces": counts["backward"],
            "tp_all_reduce_bytes": message, "tp_step_bytes": calls * message,
            "tp_step_ring_bytes_per_rank": calls * ring_bytes_per_rank(message, tp),
            "ddp_all_reduce_bytes": ddp, "ddp_ring_bytes_per_rank": ring_bytes_per_rank(ddp, tp)}


def predicted_all_reduce_ms(n_bytes: float, ranks: int, busbw_bytes_per_s: float, latency_ms: float = 0.0) -> float:
    """A model's prediction, not a measurement: an all-reduce of n_bytes over `ranks` at bus bandwidth
    `busbw_bytes_per_s` (nccl-tests' definition: every rank's link carries 2(p-1)/p x n), plus a fixed
    latency. With a published GPU figure (docs/performance-anchors.md, "Published GPU figures") it says
    what the link would do."""
    if busbw_bytes_per_s <= 0 or ranks < 2:
        raise ValueError("busbw_bytes_per_s must be > 0 and ranks >= 2")
    return latency_ms + ring_bytes_per_rank(n_bytes, ranks) / busbw_bytes_per_s * 1e3
