"""The tensor-parallel task (notebook 09): one layer split inside itself over the ranks, checked against
the same layer whole, its collectives counted and timed; and the 2 x 2 mesh of data and tensor parallelism.

    TensorParallel(layers=("mlp", "attention"))     # tp = world_size: every rank holds 1/tp of each layer
    TensorParallel(layers=("mlp",), dp=2)           # world_size=4: a 2 x 2 mesh, dp x tp, trained `steps` steps

Tensor parallelism (Megatron-LM) splits a layer's matrices: the MLP's first Linear by output columns,
its second by input rows, so each rank computes its slice of the hidden layer alone and one all-reduce
of the (batch, seq_len, d_model) output ends the forward; in backward one all-reduce sums the input's
gradient. Attention the same, by heads. Those all-reduces sit on the critical path: the next op needs
their result. DDP beside it (each rank 1/world_size of the batch, the whole layer) all-reduces the
layer's gradients once, and can overlap that with backward. On the mesh, the tp groups split the
layer and the dp groups average its (sharded) gradients: the result equals the layer trained whole on
the global batch.
Pure: no torch. The rank side is `rank/tasks/tensor_parallel.py` (with `rank/parallel/tensor_parallel.py`), the
formulas `predict/tensor_parallel.py`, the views `tables/tensor_parallel.py`, the experiments
`recipes/tensor_parallel.py`.
Reference: Shoeybi et al., "Megatron-LM" (2019), https://arxiv.org/abs/1909.08053, section 3.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..record.tensor_parallel import TensorParallelRecord
from .checks import bad, is_int
from .tasks import RUN_FIELDS, Phase, TaskSpec, register

# "attention-qkv-split": attention whose fused weight lists q, then k, then v, split as if it were
# head-major: a contiguous split hands a rank parts of q, k and v that do not belong together
LAYERS = ("mlp", "attention", "block", "attention-qkv-split")
HEADED = ("attention", "block", "attention-qkv-split")
MAX_ROUNDS, MAX_STEPS_PER_ROUND, MAX_MESH_STEPS = 1000, 100, 100
MAX_ACTIVATION_ELEMENTS = 2 ** 24   # local_batch x seq_len x 4 d_model: the largest activation a rank holds


@register
@dataclass(frozen=True, kw_only=True)
class TensorParallel(TaskSpec):
    """Tensor parallelism of each layer in `layers` over tp = world_size / dp ranks (`rank/tasks/
    tensor_parallel.py`). dp = 1: every rank builds the dense layer from `seed`, splits a copy with
    torch's `parallelize_module`, feeds both the same `local_batch` x `seq_len` x `d_model` input and
    output gradient, records the errors and the collectives, then times `rounds` interleaved rounds of
    `steps_per_round` steps of the dense layer, the split one, and the dense layer under DDP (each
    rank local_batch / world_size examples; `bucket_cap_mb` its buckets). dp > 1: a dp x tp mesh
    trains each layer `steps` SGD steps (`lr`) on dp x local_batch examples, against the dense layer
    trained on all of them."""

    kind = "tensor-parallel"
    runner = "ddplab.rank.tasks.tensor_parallel:run"
    record = TensorParallelRecord
    phases = (Phase("build", 2), Phase("check", 3, "all_reduce of a split layer's activations or gradients"),
              Phase("round", 4, "all_reduce of a split layer, or DDP's gradient all-reduce"),
              Phase("mesh-step", 5, "all_reduce over a tp group or a dp group"))
    reads = RUN_FIELDS | {"d_model", "n_heads", "seed", "local_batch", "seq_len", "steps", "lr", "bucket_cap_mb"}
    step_unit = "rounds"
    layers: tuple[str, ...] = ("mlp", "attention")
    dp: int = 1                    # data-parallel degree; tp = world_size / dp
    rounds: int = 5
    steps_per_round: int = 3

    def tp_degree(self, exp) -> int:
        return exp.world_size // self.dp

    def mesh_dims(self, exp) -> tuple[tuple[str, int], ...] | None:
        return (("dp", self.dp), ("tp", self.tp_degree(exp))) if self.dp > 1 else None

    def check(self, exp) -> None:
        layers = list(self.layers) if isinstance(self.layers, tuple) else None
        if not layers or not all(x in LAYERS for x in layers) or len(set(layers)) != len(layers):
            bad("task.layers", f"distinct layers from {', '.join(LAYERS)} (got {self.layers!r})")
        if not is_int(self.dp) or self.dp < 1 or exp.world_size % self.dp:
            bad("task.dp", f"the data-parallel degree must divide world_size={exp.world_size} (got {self.dp!r})")
        tp = self.tp_degree(exp)
        if tp < 2:
            bad("task.dp", f"leaves tp = world_size / dp = {tp}: tensor parallelism needs at least 2 ranks a group")
        for name, top in (("rounds", MAX_ROUNDS), ("steps_per_round", MAX_STEPS_PER_ROUND)):
            v = getattr(self, name)
            if not is_int(v) or not 1 <= v <= top:
                bad(f"task.{name}", f"must be an integer in 1..{top} (got {v!r})")
        if any(x in HEADED for x in layers):
            if exp.d_model % exp.n_heads:
                bad("n_heads", f"must divide d_model={exp.d_model} (got {exp.n_heads})")
            if exp.n_heads % tp:
                bad("n_heads", f"attention splits by whole heads: n_heads={exp.n_heads} does not divide over "
                               f"tp={tp} ranks")
        if any(x in ("mlp", "block") for x in layers) and (4 * exp.d_model) % tp:
            bad("d_model", f"the MLP's 4 x d_model hidden features split over tp={tp} ranks "
                           f"(got d_model={exp.d_model})")
        for name in ("local_batch", "seq_len"):
            if isinstance(getattr(exp, name), tuple):
                bad(name, "every rank of a tensor-parallel group computes on the same batch: give one value")
        if exp.local_batch * exp.seq_len * 4 * exp.d_model > MAX_ACTIVATION_ELEMENTS:
            bad("local_batch", f"local_batch x seq_len x 4 d_model is at most {MAX_ACTIVATION_ELEMENTS} elements "
                               f"in this lab (got {exp.local_batch} x {exp.seq_len} x {4 * exp.d_model})")
        if self.dp == 1:
            if exp.local_batch % exp.world_size:
                bad("local_batch", f"DDP beside tensor parallelism splits the batch over world_size="
                                   f"{exp.world_size} ranks: local_batch must divide by it (got {exp.local_batch})")
            if exp.steps != 1:
                bad("steps", "with dp=1 the task checks and times single steps (rounds, steps_per_round); "
                             "steps trains the dp x tp mesh (dp > 1)")
        else:
            if not 1 <= exp.steps <= MAX_MESH_STEPS:
                bad("steps", f"the mesh trains 1..{MAX_MESH_STEPS} steps (got {exp.steps})")
            if exp.bucket_cap_mb is not None:
                bad("bucket_cap_mb", "sets the buckets of DDP beside tensor parallelism (dp=1); the mesh "
                                     "averages its gradients in one all-reduce")
            for name in ("rounds", "steps_per_round"):
                if getattr(self, name) != getattr(TensorParallel, name):
                    bad(f"task.{name}", "times the dp=1 comparison; the mesh (dp > 1) is not timed: leave it")

    def total_steps(self, exp) -> int:
        return self.rounds if self.dp == 1 else exp.steps
