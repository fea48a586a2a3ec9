"""The tensor-parallel task's record: per layer the split check and timings, or the mesh training (pure: no torch)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Collective:
    """One collective a rank issued: in which part of the step, which op, its input's bytes, and the
    global ranks of the group it ran on."""

    phase: str                     # "forward", "backward", or on the mesh "gradient sync" (dp) and "loss"
    op: str                        # torch's functional collective, e.g. "all_reduce"
    bytes: int
    group: list[int]


@dataclass(frozen=True)
class StepTimes:
    """Per timed step of one way of running a layer, in milliseconds: forward (with the loss) and
    backward wall time, and (tensor parallel) the part of each spent in collectives on the critical
    path, from separate traced steps, or (DDP) the time its gradient all-reduces were in flight (from a
    bucket's launch to its done, overlapping buckets counted once), the part of backward after the
    last gradient was ready (its exposed tail), and the part of the in-flight time before then, while
    backward still computed (in flight together, which on a machine with cores to spare would hide the
    all-reduce; on a shared CPU the two may only take turns). One list entry per step: `rounds` rounds
    of `steps_per_round` steps, in order."""

    forward_ms: list[float]
    backward_ms: list[float]
    comm_forward_ms: list[float]
    comm_backward_ms: list[float]
    exposed_ms: list[float]
    during_backward_ms: list[float]


@dataclass(frozen=True)
class LayerRecord:
    """One layer on one rank: the split copy against the dense one on the same input, the collectives
    of one step (torch's CommDebugMode counts per module; bytes and groups from ddplab's log), and the
    timings of the dense layer alone, split, and under DDP."""

    layer: str
    params: int                    # parameter elements of the dense layer
    local_params: int              # elements this rank holds of the split layer
    output_max_abs: float          # the dense output's largest magnitude (the output error's scale)
    output_max_abs_error: float
    input_grad_max_abs: float      # the dense input gradient's largest magnitude
    input_grad_max_abs_error: float
    param_grad_max_abs: float      # the dense parameter gradients' largest magnitude, over all of them
    param_grad_max_abs_error: dict[str, float]     # per parameter, the gathered full gradient vs dense
    module_counts: dict[str, dict[str, dict[str, int]]]   # CommDebugMode: module -> forward/backward -> op -> n
    collectives: list[Collective]  # one tensor-parallel step's
    ddp_bucket_bytes: list[int]    # DDP's gradient all-reduces of one step, by bucket
    dense: StepTimes
    tp: StepTimes
    ddp: StepTimes


@dataclass(frozen=True)
class MeshLayerRecord:
    """One layer trained `steps` SGD steps on the dp x tp mesh, against the dense layer trained on the
    global batch (every dp group's examples) on this rank."""

    layer: str
    collectives: list[Collective]  # one training step's, each with its group
    losses: list[float]            # per step: the global-batch loss the mesh computed (summed over dp)
    dense_losses: list[float]
    param_max_abs: float           # after the last step, the dense parameters' largest magnitude
    param_max_abs_error: dict[str, float]   # after the last step, gathered full parameter vs dense
    update_max_abs: float          # the dense parameters' largest change over the steps (what training moved)


@dataclass(frozen=True)
class TensorParallelRecord:
    """A rank's part of rank{r}.json: its groups, and per layer the tensor-parallel check (dp = 1) or
    the mesh training (dp > 1)."""

    tp: int
    dp: int
    mesh: list[list[int]]          # global ranks, one row per dp coordinate (a 1 x tp row with dp = 1)
    tp_group: list[int]
    dp_group: list[int]
    cpus: int                      # CPU cores this rank could run on (more ranks than cores take turns)
    layers: list[LayerRecord]
    mesh_layers: list[MeshLayerRecord]
