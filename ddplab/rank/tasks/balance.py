"""The balance study (`BalanceStudy`): equal tokens per rank can hide unequal compute (notebook 07).

1. Calibrate: every rank times forward+backward of the model alone (no synchronization) on its share
   of the calibration micro-batches (count, length), equal tokens at different lengths and at two
   token levels, and keeps each one's median; the points are all-gathered, and every rank fits the
   same cost model to the same points (`predict/balance.py`: t = c x batches + a x tokens + b x sum_sq).
2. Assign: each policy shares the pool (every sequence a pure function of its index, `data.py`) among
   the ranks: "tokens" as a length-grouped sampler does, "cost" by greedy longest-processing-time.
3. Check: from the same parameters, one step of each policy; its reduced gradient must equal the
   first policy's up to float rounding (the loss is the sum of token losses over the global token
   count, so the reduced gradient is the global-batch mean whoever computed which sequence).
4. Time: `rounds` rounds, the policies in alternating order, `steps_per_round` steps each, after 2
   warm-up steps per policy. A step: barrier (untimed; every rank starts together), forward+backward
   of this rank's sequences, one micro-batch per length, the gradients flattened (arrival), then ONE
   synchronous all_reduce of them (every rank must join it, so its wait for the last rank is
   unambiguous; not DDP's bucketed overlap), and no optimizer step (the study times compute and
   waiting; an update would change neither, and without it every step starts from the same
   parameters). Arrivals are all-gathered once at the end: each rank's wait is the last rank's
   arrival minus its own, on the host's shared clock (`record/`).
Runs inside a rank.
"""

from __future__ import annotations


import torch
import torch.distributed as dist

from ... import predict
from ...record.balance import BalanceArm, BalanceRecord, BalanceStep, CalibrationPoint, CostFit
from ...record.train import ModelInfo
from ...tensors import flat_float64, rel_max_diff
from ...units import ms_after
from .. import clock, data, models
from ..training import token_losses, torch_dtype

WARMUP_STEPS = 2
CALIBRATION_SEED_OFFSET = 7919   # calibration data apart from the pool's (any other seed would do)


class _Step:
    """Forward+backward of a list of (inputs, targets) micro-batches, then the flat gradient's all-reduce."""

    def __init__(self, model, device, group, global_tokens: int):
        self.model, self.device, self.group, self.global_tokens = model, device, group, global_tokens
        self.params = [p for p in model.parameters() if p.requires_grad]

    def _sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def compute(self, batches) -> None:
        for x, y in batches:
            # the sum of token losses over the global token count: the reduced sum of every rank's
            # gradient is then the global-batch mean, however the pool was shared
            (token_losses(self.model(x), y).sum() / self.global_tokens).backward()
        self._sync()

    def flat_gradient(self) -> torch.Tensor:
        return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in self.params])

    def __call__(self, batches, round_: int = -1) -> tuple[dict, torch.Tensor]:
        dist.barrier(group=self.group)
        start = clock.now_ns()
        self.compute(batches)
        flat = self.flat_gradient()
        self._sync()
        arrival = clock.now_ns()
        dist.all_reduce(flat, group=self.group)
        self._sync()
        returned = clock.now_ns()
        self.model.zero_grad(set_to_none=True)
        return dict(round=round_, start_ns=start, arrival_ns=arrival, returned_ns=returned,
                    compute_ms=ms_after(arrival, start)), flat


def run(ctx):
    """Run the study on this rank; return (BalanceRecord, no tensors)."""
    exp, task, device, group, log, rank = ctx.exp, ctx.exp.task, ctx.device, ctx.group, ctx.log, ctx.rank
    world_size = exp.world_size
    log.enter("build")
    model = models.build(exp).to(device=device, dtype=torch_dtype(exp.dtype))
    pool = list(task.pool)
    step = _Step(model, device, group, predict.balance.tokens(pool))

    points = _calibrate(ctx, step, task.shapes()[rank::world_size])
    log.enter("share-calibration")
    gathered = [None] * world_size
    dist.all_gather_object(gathered, points, group=group)
    calibration = sorted((p for ps in gathered for p in ps), key=lambda p: (-p.length, -p.count))
    fitted = predict.balance.fit([(p.tokens, p.sum_sq, p.median_ms) for p in calibration])   # the same on every rank

    arms, checks, first = {}, {}, None
    for policy in task.policies:
        mine = predict.balance.assign(policy, pool, world_size, fitted)[rank]
        arms[policy] = (mine, _batches(exp, pool, mine, device))
        log.enter("warm-up", detail=policy)
        for _ in range(WARMUP_STEPS):
            step(arms[policy][1])
        log.enter("check", detail=policy)
        reduced = flat_float64([step(arms[policy][1])[1]])
        first = reduced if first is None else first
        checks[policy] = rel_max_diff(reduced, first)

    timed: dict[str, list[dict]] = {p: [] for p in task.policies}
    for r in range(task.rounds):
        order = task.policies if r % 2 == 0 else task.policies[::-1]
        for position, policy in enumerate(order):
            log.enter("round", r, position, detail=policy)
            for _ in range(task.steps_per_round):
                timed[policy].append(step(arms[policy][1], round_=r)[0])

    # each rank's wait: the last rank's arrival minus its own, step by step (one host, one clock)
    log.enter("share-arrivals")
    arrivals = [None] * world_size
    dist.all_gather_object(arrivals, {p: [s["arrival_ns"] for s in timed[p]] for p in task.policies}, group=group)
    record = BalanceRecord(
        model=ModelInfo(models.parameter_count(model), sum(p.numel() * p.element_size() for p in model.parameters())),
        pool=pool, global_tokens=predict.balance.tokens(pool), warmup_steps=WARMUP_STEPS, calibration=calibration,
        fit=CostFit(fitted.c_ms, fitted.a_ms_per_token, fitted.b_ms_per_sq),
        arms=[_arm(policy, pool, arms[policy][0], fitted, checks[policy], timed[policy],
                   [a[policy] for a in arrivals]) for policy in task.policies])
    return record, {}


def _calibrate(ctx, step: _Step, shapes: list[tuple[int, int]]) -> list[CalibrationPoint]:
    """Time forward+backward of each of this rank's calibration shapes, alone: one untimed call each,
    then `calibration_repeats` timed rounds over them in alternating order."""
    task = ctx.exp.task
    ctx.log.enter("calibrate")
    batches = {s: [_calibration_batch(ctx.exp, *s, ctx.device)] for s in shapes}
    ms: dict[tuple[int, int], list[float]] = {s: [] for s in shapes}
    for s in shapes:
        step.compute(batches[s])
        step.model.zero_grad(set_to_none=True)
    for rep in range(task.calibration_repeats):
        for s in shapes if rep % 2 == 0 else shapes[::-1]:
            t0 = clock.now_ns()
            step.compute(batches[s])
            ms[s].append(ms_after(clock.now_ns(), t0))
            step.model.zero_grad(set_to_none=True)
    return [CalibrationPoint(count, length, ctx.rank, ms[(count, length)]) for count, length in shapes]


def _calibration_batch(exp, count: int, length: int, device):
    x, y = data.batch(exp.seed + CALIBRATION_SEED_OFFSET, list(range(count)), length, exp.vocab_size)
    return x.to(device), y.to(device)


def _batches(exp, pool: list[int], mine: list[int], device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """This rank's sequences as one (count, length) micro-batch per distinct length, longest first."""
    by_length: dict[int, list[int]] = {}
    for i in mine:
        by_length.setdefault(pool[i], []).append(i)
    out = []
    for length in sorted(by_length, reverse=True):
        x, y = data.batch(exp.seed, sorted(by_length[length]), length, exp.vocab_size)
        out.append((x.to(device), y.to(device)))
    return out


def _arm(policy, pool, mine, fitted, grad_rel_diff, steps, arrivals) -> BalanceArm:
    lengths = [pool[i] for i in mine]
    last = [max(a) for a in zip(*arrivals)]
    return BalanceArm(policy=policy, sequences=list(mine), lengths=lengths, tokens=predict.balance.tokens(lengths),
                      sum_sq=predict.balance.sum_sq(lengths), predicted_ms=fitted.lengths_ms(lengths), grad_rel_diff=grad_rel_diff,
                      steps=[BalanceStep(**s, wait_ms=ms_after(t, s["arrival_ns"])) for s, t in zip(steps, last)])

