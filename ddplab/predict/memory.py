"""Predicted memory per rank, by category and phase of a step, from the spec alone (pure).

What classic data parallelism holds on every rank, with P parameters of e bytes each:
- parameters: P*e, and the same again for gradients once backward has run;
- DDP's bucket buffers: another P*e that gradients are copied into for the all-reduce, unless
  `gradient_as_bucket_view=True` makes the gradients views into the buckets;
- optimizer state from the first step on: nothing for plain SGD, P*e of momentum for SGD with
  momentum, 2*P*e for Adam/AdamW (plus one 4-byte `step` counter per parameter tensor);
- activations: what the forward saves for backward, proportional to local batch x sequence length.
None of these depends on the world size: adding ranks adds copies, it does not divide them.
ZeRO-1 (`sharding="zero1"`, torch's `ZeroRedundancyOptimizer`) changes one term: each rank keeps the
optimizer state of only the whole parameter tensors it owns (`zero1_owners`), so the state differs
from rank to rank and sums over the ranks to the unsharded state; parameters, gradients and buckets
stay whole. The model covers plain DDP and ZeRO-1 with one micro-step per optimizer step (not FSDP2).
`activation_bytes` is exact for the built-in models (checked against the saved-tensor meter); tests
compare every category with real runs. Used by notebook 02 and its widget.
"""

from __future__ import annotations

from ..units import DTYPE_BYTES

PHASES = ("forward", "backward", "step")
# what the ledger counts, measured (rank/probes/memory.py) and predicted (here)
CATEGORIES = ("parameters", "gradients", "ddp_buckets", "optimizer_state", "activations")
INDEX_BYTES = 8  # token ids and targets are int64


def parameter_numels(exp) -> list[int]:
    """Element count of every parameter tensor of a built-in model (`rank/models.py`), in
    `parameters()` order, from the spec alone."""
    v, d, n = exp.vocab_size, exp.d_model, exp.n_layers
    if exp.model == "transformer":
        block = [d, d, 3 * d * d, 3 * d, d * d, d, d, d, 4 * d * d, 4 * d, 4 * d * d, d]
        return [v * d, max(exp.seq_lens) * d, *block * n, d, d] + ([] if exp.tie_weights else [v * d])
    if exp.model == "mlp":
        return [v * d, *[d * d, d] * n, v * d, v]
    if exp.model == "branchy":
        return [v * d, v, v * d, *[d * d, d] * 4]
    raise ValueError(f"Experiment.model: {exp.model} is not built in; its parameter count is known only by building it")


def activation_bytes(exp, rank: int = 0) -> int:
    """Bytes autograd saves during one micro-step's forward on `rank` (built-in models, rank-mean or
    global-token loss; global-sample saves a few bytes more)."""
    b, t, e = exp.local_batch_of(rank), exp.seq_len_of(rank), DTYPE_BYTES[exp.dtype]
    n, d, v = b * t, exp.d_model, exp.vocab_size
    ids = b * (t + 1) * INDEX_BYTES            # the token ids (a view of each example's t+1 tokens)
    head = n * v * e + n * INDEX_BYTES + e     # log-softmax of the logits, flattened targets, a scalar
    if exp.model == "mlp":
        # the embedding output and every ReLU output (each is also the next Linear's input)
        return ids + (exp.n_layers + 1) * n * d * e + head
    if exp.model != "transformer":
        raise ValueError(f"Experiment.model: no activation model for {exp.model}; measure it instead")
    # per block: 16*n*d saved (LN input and output x2, q/k/v, attention output, its projection input,
    # MLP hidden before and after GELU at 4*d each), 2 LNs x (mean, rstd), attention's log-sum-exp
    block = 16 * n * d * e + 4 * n * e + b * exp.n_heads * t * e
    final = 2 * n * d * e + 2 * n * e          # final LayerNorm input, output and its statistics
    return ids + t * INDEX_BYTES + exp.n_layers * block + final + head


def zero1_owners(numels: list[int], world_size: int) -> list[int]:
    """The rank that keeps each parameter tensor's optimizer state under ZeRO-1, by torch's rule
    (`ZeroRedundancyOptimizer._partition_parameters`, one parameter group, frozen parameters
    included): tensors sorted by element count, largest first (a stable sort: equal sizes keep their
    order), each given to the rank with the fewest elements so far (the lowest such rank on a tie)."""
    loads = [0] * world_size
    owners = [0] * len(numels)
    for i in sorted(range(len(numels)), key=lambda i: numels[i], reverse=True):
        owner = loads.index(min(loads))
        owners[i] = owner
        loads[owner] += numels[i]
    return owners


def optimizer_state_bytes(exp, numels: list[int], trainable: list[bool]) -> int:
    """The optimizer's state for these parameter tensors once it has stepped (frozen ones have none)."""
    g = sum(n for n, t in zip(numels, trainable) if t) * DTYPE_BYTES[exp.dtype]
    if exp.optimizer == "sgd":
        return g if exp.momentum else 0
    return 2 * g + 4 * sum(trainable)   # Adam/AdamW: two moments and a float32 step counter each


def state_bytes(exp, numels: list[int] | None = None, trainable: list[bool] | None = None,
                rank: int = 0) -> dict[str, int]:
    """Model-state bytes on `rank` once the optimizer has stepped: parameters, gradients, buckets, state.
    `numels` and `trainable` (every parameter tensor's size and requires_grad, as a run records them)
    stand in for the spec's model: a user's model, or frozen parameters, which get no gradient, no
    bucket slot and no optimizer state. Under ZeRO-1 the state is that of the tensors `rank` owns."""
    if exp.sharding not in ("none", "zero1"):
        raise ValueError(f"Experiment.sharding: the memory model covers 'none' and 'zero1', not "
                         f"{exp.sharding!r}; measure it instead")
    if not 0 <= rank < exp.world_size:
        raise ValueError(f"rank: {rank} is not one of the experiment's ranks 0..{exp.world_size - 1}")
    numels = parameter_numels(exp) if numels is None else list(numels)
    trainable = [True] * len(numels) if trainable is None else list(trainable)
    e = DTYPE_BYTES[exp.dtype]
    g = sum(n for n, t in zip(numels, trainable) if t) * e
    if exp.sharding == "zero1":
        mine = [o == rank for o in zero1_owners(numels, exp.world_size)]
        opt = optimizer_state_bytes(exp, [n for n, m in zip(numels, mine) if m],
                                    [t for t, m in zip(trainable, mine) if m])
    else:
        opt = optimizer_state_bytes(exp, numels, trainable)
    return {"parameters": sum(numels) * e, "gradients": g, "ddp_buckets": g if exp.sync == "ddp" else 0,
            "optimizer_state": opt}


def predict(exp, rank: int = 0, step: int = 1, numels: list[int] | None = None,
            trainable: list[bool] | None = None) -> dict[str, dict[str, int | None]]:
    """Phase -> category -> bytes on `rank` in optimizer step `step`, sampled as the worker samples:
    after the last forward, after the last backward, after the optimizer step (before zero_grad).
    Given `numels` and `trainable` (a user's model as its run recorded it, or a built-in one's from its
    spec), the model-state terms come from them; the activations only for the transformer and the MLP,
    whose shapes determine them (else None: measure them)."""
    s = state_bytes(exp, numels, trainable, rank)
    if numels is None or exp.model in ("transformer", "mlp"):
        acts = activation_bytes(exp, rank)
    else:
        acts = None
    opt_before = s["optimizer_state"] if step > 0 else 0
    views = exp.gradient_as_bucket_view
    return {
        # zero_grad(set_to_none=True) left no gradients; the buckets hold none either
        "forward": {"parameters": s["parameters"], "gradients": 0, "ddp_buckets": s["ddp_buckets"],
                    "optimizer_state": opt_before, "activations": acts},
        "backward": {"parameters": s["parameters"], "gradients": s["gradients"],
                     "ddp_buckets": 0 if views else s["ddp_buckets"], "optimizer_state": opt_before, "activations": 0},
        "step": {"parameters": s["parameters"], "gradients": s["gradients"],
                 "ddp_buckets": 0 if views else s["ddp_buckets"], "optimizer_state": s["optimizer_state"],
                 "activations": 0},
    }


RANK_BASELINE_BYTES = 320 * 2 ** 20   # one CPU rank after `import torch` and gloo's start: 317 MiB measured


def rank_bytes_estimate(exp, parameter_bytes: int | None = None) -> int:
    """A generous estimate of what one rank of `exp` holds at its peak, for refusing what cannot fit
    before anything starts (not a prediction to compare with measurements: that is `predict`).
    `parameter_bytes` stands in for a user's model, whose shapes the spec does not know."""
    kind = exp.task.kind
    if kind == "allreduce-sweep":
        return RANK_BASELINE_BYTES + 2 * sum(exp.task.sweep_bytes)
    if parameter_bytes is None:
        parameter_bytes = sum(parameter_numels(exp)) * DTYPE_BYTES[exp.dtype]
    if kind == "bucket-sweep":   # a copy of the model per plan: parameters, gradients, buckets, a spare
        return RANK_BASELINE_BYTES + (len(exp.task.plans) + 2) * 4 * parameter_bytes
    acts = max(activation_bytes(exp, r) for r in range(exp.world_size)) if exp.model in ("transformer", "mlp") else 0
    # model state (parameters, gradients, buckets, two optimizer moments) and twice the activations,
    # for the temporaries of backward
    return RANK_BASELINE_BYTES + 5 * parameter_bytes + 2 * acts


FIT_SHARE = 0.8   # of the available memory, what the ranks of a launch may use (launch/preflight.py)


def largest_local_batch(exp, parameter_bytes: int, activations_per_example: int, available_bytes: int,
                        ranks: int) -> int:
    """The largest local batch whose `ranks` ranks fit in FIT_SHARE of `available_bytes` by the launch's own
    estimate: `rank_bytes_estimate` (model state) plus twice the activations, `activations_per_example`
    (measured, for a model the lab cannot count) times the local batch; 0 if not even model state fits."""
    room = FIT_SHARE * available_bytes / ranks - rank_bytes_estimate(exp, parameter_bytes)
    if room <= 0:
        return 0
    return int(room // (2 * activations_per_example)) if activations_per_example > 0 else 2 ** 62
