"""FSDP2's memory on one rank over one training step of a built-in model, predicted from the spec (pure).

ddplab shards every layer as a unit (`rank/parallel/fsdp.py`): the transformer's two embeddings, each
block, the final norm and the head (the MLP model's embedding, each hidden Linear and the head), then
the root, which holds nothing of its own. What a rank holds:

- its shard of every unit, always: FSDP2 splits each parameter along dim 0 into world_size chunks of
  ceil(dim0 / world_size) rows and pads the last ones, so every rank stores the padded shard
  (`shard_bytes`); its sharded gradients once the reduce-scatters have delivered them (padded the same
  way); the optimizer state of its unpadded rows (the last ranks may own fewer rows);
- a unit's gathered parameters (`gathered_bytes` = world_size x its padded shard) from its all-gather
  until it is resharded: after its forward with `reshard_after_forward=True`, after its backward with
  False, so without resharding every unit is gathered at once at the end of the forward;
- the all-gather's flat output buffer, a second copy of the unit: in forward FSDP2 keeps it until the
  next unit's copy-out (to overlap the two), in backward it frees it at once; a prefetched unit's buffer
  is alive from the prefetch on. Explicit prefetch gathers the next unit during the forward; in backward
  FSDP2 already prefetches the previous unit by default, so explicit backward prefetch changes nothing;
- a unit's full gradients from its backward until its reduce-scatter, and the reduce-scatter's input
  (another full copy), which FSDP2 keeps until the next unit's reduce-scatter;
- the activations autograd saved (`predict.memory.activation_bytes`, split by unit), freed unit by
  unit in backward.

`timeline` walks these allocations and frees in FSDP2's order (torch 2.13) and returns the moments,
among them the ones the rank samples (`spec.fsdp_memory.SAMPLE_EVENTS`); `peak` is their largest total.
Temporaries of the computation itself (gradients of activations, logits) are left out: the model is
for models whose parameters dominate, and the tests hold it to 10% of real runs.
Used by notebook 09 and `tables/fsdp_memory.py`.
Reference: https://pytorch.org/docs/stable/distributed.fsdp.fully_shard.html
"""

from __future__ import annotations

from dataclasses import dataclass

from ..units import DTYPE_BYTES
from .memory import INDEX_BYTES, activation_bytes, optimizer_state_bytes

CATEGORIES = ("sharded_parameters", "optimizer_state", "gradients", "gathered_parameters", "unsharded_gradients",
              "activations", "comm_buffers", "other")
STATE = ("sharded_parameters", "optimizer_state", "gradients")


@dataclass(frozen=True)
class Unit:
    """One FSDP2 unit: its parameter tensors as (dim 0, elements per dim-0 row)."""

    name: str
    shapes: tuple[tuple[int, int], ...]

    @property
    def numel(self) -> int:
        return sum(d0 * rest for d0, rest in self.shapes)


def units(exp) -> list[Unit]:
    """The units ddplab shards a built-in model into, in the order the forward calls them."""
    v, d = exp.vocab_size, exp.d_model
    if exp.model == "transformer":
        block = ((d, 1), (d, 1), (3 * d, d), (3 * d, 1), (d, d), (d, 1), (d, 1), (d, 1), (4 * d, d), (4 * d, 1),
                 (d, 4 * d), (d, 1))
        return [Unit("tok_emb", ((v, d),)), Unit("pos_emb", ((max(exp.seq_lens), d),)),
                *[Unit(f"blocks.{i}", block) for i in range(exp.n_layers)],
                Unit("ln_f", ((d, 1), (d, 1))), Unit("head", ((v, d),))]
    if exp.model == "mlp":
        return [Unit("emb", ((v, d),)), *[Unit(f"hidden.{2 * i}", ((d, d), (d, 1))) for i in range(exp.n_layers)],
                Unit("head", ((v, d), (v, 1)))]
    raise ValueError(f"Experiment.model: the FSDP2 memory model knows the built-in transformer and mlp, "
                     f"not {exp.model!r}")


def embedding_units(exp) -> list[int]:
    """The units whose forward takes token ids (no gradient flows into them): the embeddings."""
    return [0, 1] if exp.model == "transformer" else [0]


def _rows(d0: int, world_size: int) -> int:
    return -(-d0 // world_size)


def shard_bytes(unit: Unit, world_size: int, e: int) -> int:
    """A rank's padded shard of the unit: ceil(dim0 / world_size) rows of every parameter."""
    return sum(_rows(d0, world_size) * rest for d0, rest in unit.shapes) * e


def _local_rows(d0: int, world_size: int, rank: int) -> int:
    rows = _rows(d0, world_size)
    return max(0, min(rows, d0 - rank * rows))


def local_numel(unit: Unit, world_size: int, rank: int) -> int:
    """The unit's elements `rank` really owns (its rows of torch.chunk's split, without padding)."""
    return sum(_local_rows(d0, world_size, rank) * rest for d0, rest in unit.shapes)


def unit_activation_bytes(exp, rank: int = 0) -> list[int]:
    """`predict.memory.activation_bytes` split by the unit whose forward saves it, plus one last entry:
    what the loss saves (the log-softmax, targets). The entries sum to activation_bytes(exp, rank)."""
    b, t, e = exp.local_batch_of(rank), exp.seq_len_of(rank), DTYPE_BYTES[exp.dtype]
    n, d, v = b * t, exp.d_model, exp.vocab_size
    ids = b * (t + 1) * INDEX_BYTES
    loss = n * v * e + n * INDEX_BYTES + e
    if exp.model == "transformer":
        block = 16 * n * d * e + 4 * n * e + b * exp.n_heads * t * e
        # ln_f saves its input and statistics, the head saves ln_f's output
        out = [ids, t * INDEX_BYTES, *[block] * exp.n_layers, n * d * e + 2 * n * e, n * d * e, loss]
    elif exp.model == "mlp":
        # each Linear (and the head) saves its input: the embedding's or the previous ReLU's output
        out = [ids, *[n * d * e] * exp.n_layers, n * d * e, loss]
    else:
        units(exp)   # raises naming the model
    assert sum(out) == activation_bytes(exp, rank), "the split must add up to the activation model"
    return out


def sharded_state(exp, rank: int = 0) -> dict[str, int]:
    """What `rank` holds persistently: padded parameter and gradient shards, its optimizer state (that of
    its unpadded rows of every parameter tensor, `predict.memory.optimizer_state_bytes`)."""
    w, e, us = exp.world_size, DTYPE_BYTES[exp.dtype], units(exp)
    shards = sum(shard_bytes(u, w, e) for u in us)
    numels = [_local_rows(d0, w, rank) * rest for u in us for d0, rest in u.shapes]   # every tensor's own rows
    return {"sharded_parameters": shards, "gradients": shards,
            "optimizer_state": optimizer_state_bytes(exp, numels, [True] * len(numels))}


class _Walk:
    """Live bytes by category, moment by moment; `moments` records each (event, unit, categories, total)."""

    def __init__(self, held: dict[str, int]):
        self.bytes = {c: 0 for c in CATEGORIES}
        self.bytes.update(held)
        self.moments: list[dict] = []

    def add(self, category: str, n: int) -> None:
        self.bytes[category] += n

    def mark(self, event: str, unit: int | None = None, sampled: bool = False) -> None:
        self.moments.append({"event": event, "unit": unit, "sampled": sampled, "bytes": dict(self.bytes),
                             "total": sum(self.bytes.values())})


def timeline(exp, reshard_after_forward: bool = True, prefetch: bool = False, rank: int = 0) -> list[dict]:
    """FSDP2's allocations and frees on `rank` through one step after the warm-up, in FSDP2's order:
    a list of moments {"event", "unit", "sampled", "bytes" (category -> bytes), "total"}. The sampled
    ones are the moments the rank samples (`spec.fsdp_memory.SAMPLE_EVENTS`); the others are transients
    between them (an all-gather's copy-out, a reduce-scatter's copy-in)."""
    w, e, us = exp.world_size, DTYPE_BYTES[exp.dtype], units(exp)
    shard = [shard_bytes(u, w, e) for u in us]
    full = [w * s for s in shard]
    acts = unit_activation_bytes(exp, rank)
    state = sharded_state(exp, rank)
    walk = _Walk({"sharded_parameters": state["sharded_parameters"], "optimizer_state": state["optimizer_state"]})
    gathered = [False] * len(us)
    pending = [False] * len(us)   # an all-gather's flat output not yet copied out
    kept = None                   # the flat output FSDP2 keeps in forward until the next copy-out

    def all_gather(k):
        walk.add("comm_buffers", shard[k])            # the all-gather input: this rank's shard, copied
        walk.add("comm_buffers", full[k])             # the flat output
        walk.mark("all-gather", k)
        walk.add("comm_buffers", -shard[k])
        pending[k] = True

    def unshard(k, forward):
        nonlocal kept
        if gathered[k]:
            return
        if not pending[k]:
            all_gather(k)
        walk.add("gathered_parameters", full[k])      # copy-out into the parameters' own storage
        walk.mark("copy-out", k)
        gathered[k], pending[k] = True, False
        if forward:
            if kept is not None:
                walk.add("comm_buffers", -full[kept])  # the previous unit's flat output, freed now
            kept = k
        else:
            walk.add("comm_buffers", -full[k])

    walk.mark("step-start", sampled=True)
    for k in range(len(us)):
        unshard(k, forward=True)
        if prefetch and k + 1 < len(us):
            all_gather(k + 1)
        walk.mark("pre-forward", k, sampled=True)
        walk.add("activations", acts[k])
        if reshard_after_forward:
            walk.add("gathered_parameters", -full[k])
            gathered[k] = False
        walk.mark("post-forward", k, sampled=True)
    if kept is not None:                               # the root's post-forward frees the last one
        walk.add("comm_buffers", -full[kept])
        kept = None
    walk.add("activations", acts[-1])
    walk.mark("loss", sampled=True)
    scattering = None                                  # the reduce-scatter input FSDP2 keeps

    def post_backward(k):
        nonlocal scattering
        walk.add("gathered_parameters", -full[k])      # resharded after backward
        gathered[k] = False
        if scattering is not None:
            walk.add("comm_buffers", -full[scattering])
        walk.add("comm_buffers", full[k])              # the reduce-scatter input, a copy of the gradients
        walk.mark("reduce-scatter", k)
        walk.add("unsharded_gradients", -full[k])
        walk.add("gradients", shard[k])
        scattering = k

    # an embedding's input (token ids) needs no gradient: the rank's backward hooks on it fire as soon as
    # its output's gradient is there, before FSDP2 gathers it, and FSDP2 reduce-scatters its gradients
    # only in the root's final callback, at the end of the backward
    embeddings = embedding_units(exp)
    for k in reversed(range(len(us))):
        walk.mark("pre-backward", k, sampled=True)
        if k in embeddings:
            walk.mark("post-backward", k, sampled=True)
        unshard(k, forward=False)
        if k > 0 and not gathered[k - 1] and not pending[k - 1]:
            all_gather(k - 1)                          # FSDP2's default backward prefetch
        walk.add("unsharded_gradients", full[k])
        walk.add("activations", -acts[k] - (acts[-1] if k == len(us) - 1 else 0))
        if k not in embeddings:
            walk.mark("post-backward", k, sampled=True)
            post_backward(k)
    for k in sorted(embeddings):
        post_backward(k)
    if scattering is not None:
        walk.add("comm_buffers", -full[scattering])
    walk.mark("backward-end", sampled=True)
    walk.mark("optimizer-end", sampled=True)
    return walk.moments


def peak(exp, reshard_after_forward: bool = True, prefetch: bool = False, rank: int = 0) -> int:
    """The predicted peak of the step on `rank`: the largest total of `timeline`."""
    return peak_moment(exp, reshard_after_forward, prefetch, rank)["total"]


def peak_moment(exp, reshard_after_forward: bool = True, prefetch: bool = False, rank: int = 0) -> dict:
    """The moment of `timeline` with the largest total: what is alive together at the predicted peak."""
    return max(timeline(exp, reshard_after_forward, prefetch, rank), key=lambda m: m["total"])
