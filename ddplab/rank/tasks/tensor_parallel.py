"""The tensor-parallel task (`TensorParallel`, notebook 09), inside each rank.

dp = 1, per layer: build the dense layer from the seed, split a copy over every rank
(`rank/parallel/tensor_parallel.py`), run both on the same input and output gradient, and record how far the
split output, input gradient and (gathered) parameter gradients are from the dense ones, beside the
dense values' largest magnitudes (the errors' scale). Torch's `CommDebugMode` counts that step's
collectives per module (which Linear issued which all-reduce); a second step under ddplab's
`CollectiveLog` (`rank/probes/collectives.py`) records each collective's op, phase, bytes and group,
which is where the per-step collectives, bytes and groups of the record come from. Then rounds of
steps are timed, in an order that rotates every round: the dense layer alone (no communication), the
split layer, the split layer with its collectives timed (`CollectiveLog`), and the dense layer under
DDP on a 1/world_size slice of the batch, its gradient all-reduce timed from launch to done by a
pass-through comm hook (`probes/buckets.BucketLog`).
dp > 1: on the dp x tp `DeviceMesh` named ("dp", "tp") that the worker built over the experiment's ranks
(on every rank of the launch, so it runs inside a wider launch or session too): the layer split over each
tp group, its local gradients averaged over the dp group in one all-reduce, SGD; the dense layer trained
on the global batch beside it.
Runs inside a rank.
"""

from __future__ import annotations

import copy
import os

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.debug import CommDebugMode

from ...record.tensor_parallel import Collective, LayerRecord, MeshLayerRecord, StepTimes, TensorParallelRecord
from .. import runtime
from ..parallel.ddp import wrap_in_ddp
from ..parallel.tensor_parallel import build_layer, split_over_mesh
from ..probes.buckets import BucketLog
from ..probes.collectives import CollectiveLog
from ..probes.memory import local
from ..training import full
from .. import clock

VARIANTS = ("dense", "tp", "tp-traced", "ddp")


def batch(exp, examples: int, salt: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """`examples` x seq_len x d_model inputs and output gradients, the same on every rank."""
    g = torch.Generator().manual_seed(exp.seed * 1000 + salt)
    shape = (examples, exp.seq_len, exp.d_model)
    return torch.randn(shape, generator=g).to(device), torch.randn(shape, generator=g).to(device)


def _max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.detach() - b.detach()).abs().max().item()


def _counts(mode: CommDebugMode) -> dict:
    return {module: {phase: {str(op).split(".")[-1]: n for op, n in ops.items()}
                     for phase, ops in phases.items()}
            for module, phases in mode.comm_module_counts.items()}


def _collectives(events: list[dict]) -> list[Collective]:
    return [Collective(e["phase"], e["op"], e["bytes"], e["group"]) for e in events]


def _step(module, x, g, log: CollectiveLog | None = None) -> tuple[float, float, int]:
    """One forward (with the loss, which waits for the output's all-reduce) and backward: their ms,
    and the time (rank/clock.py) at which backward returned."""
    sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)   # a GPU computes behind the host's back
    sync()
    t0 = clock.now_ns()
    loss = (module(x) * g).sum()
    loss.item()
    t1 = clock.now_ns()
    if log is not None:
        log.phase = "backward"
    loss.backward()
    sync()
    t2 = clock.now_ns()
    if log is not None:
        log.phase = "forward"
    return (t1 - t0) / 1e6, (t2 - t1) / 1e6, t2


def _union_ns(spans: list[tuple[int, int]]) -> int:
    """Nanoseconds covered by at least one (start, end) span: buckets in flight at once count once."""
    total, reach = 0, None
    for a, b in sorted(spans):
        if reach is None or a > reach:
            total, reach = total + max(0, b - a), b
        elif b > reach:
            total, reach = total + b - reach, b
    return total


def ddp_comm_split(spans: list[tuple[int, int]], end_ns: int) -> tuple[float, float, float]:
    """DDP's gradient all-reduces of one step, from their buckets' (launch, done) times and
    the ns at which backward returned: ms in flight (overlapping buckets counted once), ms of that
    before the last bucket launched (while backward still computed: the last launch is when the last
    gradient was ready), and ms of backward after that launch (the exposed tail)."""
    last = max(a for a, _ in spans)
    return (_union_ns(spans) / 1e6, _union_ns([(a, min(b, last)) for a, b in spans]) / 1e6,
            max(0, end_ns - last) / 1e6)


def _zero(module, x) -> None:
    for p in module.parameters():
        p.grad = None
    x.grad = None


def check_layer(exp, layer: str, mesh, device) -> tuple[dict, object, object, torch.Tensor, torch.Tensor]:
    """The split layer against the dense one: errors, per-module counts, one step's collectives; and
    the dense layer, the split one and the input and output gradient they ran on (for `Timed`)."""
    dense = build_layer(layer, exp.d_model, exp.n_heads, exp.seed).to(device)
    split = split_over_mesh(copy.deepcopy(dense), layer, mesh)
    x, g = batch(exp, exp.local_batch, 1, device)
    xd, xt = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    yd = dense(xd)
    (yd * g).sum().backward()
    counter = CommDebugMode()
    with counter:
        yt = split(xt)
        (yt * g).sum().backward()
    grads = dict(dense.named_parameters())
    errors = {name: _max_err(full(p.grad), grads[name].grad) for name, p in split.named_parameters()}
    fields = dict(layer=layer, params=sum(p.numel() for p in dense.parameters()),
                  local_params=sum(local(p).numel() for p in split.parameters()),
                  output_max_abs=yd.abs().max().item(), output_max_abs_error=_max_err(yt, yd),
                  input_grad_max_abs=xd.grad.abs().max().item(), input_grad_max_abs_error=_max_err(xt.grad, xd.grad),
                  param_grad_max_abs=max(p.grad.abs().max().item() for p in dense.parameters()),
                  param_grad_max_abs_error=errors,
                  module_counts=_counts(counter))
    _zero(split, xt)
    log = CollectiveLog()
    with log:
        _step(split, xt, g, log)
    fields["collectives"] = _collectives(log.take()[0])
    _zero(split, xt)
    return fields, dense, split, x, g


class Timed:
    """One layer's three ways to run, set up for timing: the dense layer, the split one, and the dense
    layer under DDP on this rank's 1/world_size of the batch, with its buckets logged. `x` and `g`
    are the input and output gradient `check_layer` ran them on."""

    def __init__(self, ctx, exp, dense, split, x, g):
        w, r = exp.world_size, ctx.rank
        self.g = g
        self.xd, self.xt = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        share = exp.local_batch // w
        self.xs = x[r * share:(r + 1) * share].clone().requires_grad_(True)
        self.gs = self.g[r * share:(r + 1) * share]
        self.dense, self.split = dense, split
        self.ddp = wrap_in_ddp(copy.deepcopy(dense), ctx.device, ctx.group, bucket_cap_mb=exp.bucket_cap_mb)
        self.buckets = BucketLog(ctx.group)
        self.ddp.register_comm_hook(None, self.buckets.hook)
        self.log = CollectiveLog()
        self.bucket_bytes: list[int] = []
        self.times = {v: {k: [] for k in StepTimes.__dataclass_fields__} for v in ("dense", "tp", "ddp")}

    def step(self, variant: str) -> None:
        if variant == "dense":
            f, b, _ = _step(self.dense, self.xd, self.g)
            _zero(self.dense, self.xd)
        elif variant == "tp":
            f, b, _ = _step(self.split, self.xt, self.g)
            _zero(self.split, self.xt)
        elif variant == "tp-traced":   # the collectives' time only: the mode slows every op it sees
            with self.log:
                _step(self.split, self.xt, self.g, self.log)
            _, comm = self.log.take()
            _zero(self.split, self.xt)
            self.times["tp"]["comm_forward_ms"].append(comm.get("forward", 0) / 1e6)
            self.times["tp"]["comm_backward_ms"].append(comm.get("backward", 0) / 1e6)
            return
        else:
            f, b, end = _step(self.ddp, self.xs, self.gs)
            events = self.buckets.take()
            self.bucket_bytes = [e.bytes for e in events]
            # all-reduces run on gloo's threads while backward goes on; what is left after the last
            # gradient is ready (the last bucket's launch) is the exposed tail
            in_flight, during, exposed = ddp_comm_split([(e.launch_ns, e.done_ns) for e in events], end)
            self.times["ddp"]["comm_backward_ms"].append(in_flight)
            self.times["ddp"]["exposed_ms"].append(exposed)
            self.times["ddp"]["during_backward_ms"].append(during)
            _zero(self.ddp, self.xs)
        self.times[variant.split("-")[0]]["forward_ms"].append(f)
        self.times[variant.split("-")[0]]["backward_ms"].append(b)

    def fields(self) -> dict:
        return dict(ddp_bucket_bytes=self.bucket_bytes, **{v: StepTimes(**t) for v, t in self.times.items()})


def time_layers(ctx, task, timed: list[Timed]) -> None:
    """`rounds` rounds; in each, every layer and every variant, in an order that moves one on each round."""
    n, m = len(VARIANTS), len(timed)
    for k in range(task.rounds):
        ctx.log.enter("round", k)
        for j in range(m):
            layer = timed[(j + k) % m]
            for i in range(n):
                variant = VARIANTS[(i + k) % n]
                dist.barrier(group=ctx.group)   # every rank starts the variant together
                for _ in range(task.steps_per_round):
                    layer.step(variant)


def train_mesh(ctx, exp, task, layer: str, mesh) -> MeshLayerRecord:
    """`steps` SGD steps of the layer split over the tp group, gradients averaged over the dp group,
    beside the dense layer trained on the global batch."""
    tp_mesh, dp_group = mesh["tp"], mesh["dp"].get_group()
    dense = build_layer(layer, exp.d_model, exp.n_heads, exp.seed).to(ctx.device)
    split = split_over_mesh(copy.deepcopy(dense), layer, tp_mesh)
    b, dp = exp.local_batch, task.dp
    coordinate = mesh.get_coordinate()[0]   # which dp group's share of the global batch this rank computes
    start = [p.detach().clone() for p in dense.parameters()]
    dense_opt = torch.optim.SGD(dense.parameters(), lr=exp.lr)
    split_opt = torch.optim.SGD(split.parameters(), lr=exp.lr)
    log = CollectiveLog()
    losses, dense_losses, collectives = [], [], []
    for step in range(exp.steps):
        ctx.log.enter("mesh-step", step)
        x, g = batch(exp, dp * b, 10 + step, ctx.device)   # the global batch, the same on every rank
        dense_loss = (dense(x) * g).sum() / (dp * b)
        dense_loss.backward()
        dense_opt.step()
        dense_opt.zero_grad()
        with log:
            loss = (split(x[coordinate * b:(coordinate + 1) * b]) * g[coordinate * b:(coordinate + 1) * b]).sum() / b
            loss_value = loss.item()
            log.phase = "backward"
            loss.backward()
            log.phase = "gradient sync"
            params = list(split.parameters())
            flat = torch.cat([local(p.grad).reshape(-1) for p in params])
            flat = funcol.wait_tensor(funcol.all_reduce(flat, "sum", dp_group)) / dp
            offset = 0
            for p in params:
                shard = local(p.grad)
                shard.copy_(flat[offset:offset + shard.numel()].view_as(shard))
                offset += shard.numel()
            log.phase = "loss"   # the global-batch loss, for the record only
            mine = torch.tensor([loss_value / dp], device=ctx.device)
            total = funcol.wait_tensor(funcol.all_reduce(mine, "sum", dp_group))
            log.phase = "forward"
        events, _ = log.take()
        if step == 0:
            collectives = _collectives(events)
        split_opt.step()
        split_opt.zero_grad()
        losses.append(total.item())
        dense_losses.append(dense_loss.item())
    params = dict(dense.named_parameters())
    errors = {name: _max_err(full(p), params[name]) for name, p in split.named_parameters()}
    scale = max(p.abs().max().item() for p in dense.parameters())
    moved = max(_max_err(p, p0) for p, p0 in zip(dense.parameters(), start))
    return MeshLayerRecord(layer, collectives, losses, dense_losses, scale, errors, moved)


def run(ctx):
    exp, task = ctx.exp, ctx.exp.task
    ctx.log.enter("build", 0)
    tp, dp = task.tp_degree(exp), task.dp
    layers, mesh_layers = [], []
    if dp == 1:
        mesh = DeviceMesh.from_group(ctx.group or dist.group.WORLD, ctx.device.type)
        tp_group, dp_group, rows = dist.get_process_group_ranks(mesh.get_group()), [ctx.rank], [mesh.mesh.tolist()]
        checked = []
        for layer in task.layers:
            ctx.log.enter("check", 0)
            fields, dense, split, x, g = check_layer(exp, layer, mesh, ctx.device)
            checked.append((fields, Timed(ctx, exp, dense, split, x, g)))
        time_layers(ctx, task, [t for _, t in checked])
        layers = [LayerRecord(**fields, **t.fields()) for fields, t in checked]
        del checked   # DDP references the process group: gone before teardown
    else:
        mesh = ctx.mesh   # the dp x tp mesh every rank of the launch built (`TensorParallel.mesh_dims`)
        tp_group = dist.get_process_group_ranks(mesh["tp"].get_group())
        dp_group = dist.get_process_group_ranks(mesh["dp"].get_group())
        rows = mesh.mesh.tolist()
        for layer in task.layers:
            mesh_layers.append(train_mesh(ctx, exp, task, layer, mesh))
    mine = runtime.cores()
    cpus = len(mine) if mine is not None else os.cpu_count()
    return TensorParallelRecord(tp, dp, rows, tp_group, dp_group, cpus, layers, mesh_layers), {}
