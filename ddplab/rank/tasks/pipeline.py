"""The pipeline task (`Pipeline`, notebook 09): this rank is one stage of the transformer, and torch's
GPipe and 1F1B schedules push the same global batch through the stages as m microbatches.

1. Build: every rank builds the whole model from the same seed (bit-identical) and keeps its stage
   (`rank/parallel/pipeline.py`); the global batch is the examples 0..global_batch-1 (`data.py`).
2. Reference: before any stage runs, the rank computes the unsplit model's loss and gradient on the
   whole global batch, alone (single process, no communication).
3. Check: one step of every (schedule, m), compared with the reference: the loss (last stage) and
   this stage's parameter gradients (max abs error), after one untimed warm-up step (a schedule's
   first step also infers the stages' shapes). No optimizer step: every step starts from the same
   parameters.
4. Time: `rounds` rounds, the (schedule, m) pairs in alternating order, one step each: a barrier
   (every stage starts together), then the schedule's step with every forward, loss and backward
   timed and the saved activations metered (`rank/probes/pipeline.py`: `StageRecorder`, `LiveSavedBytes`).
Runs inside a rank.
"""

from __future__ import annotations

import contextlib
import gc

import torch
import torch.distributed as dist

from ...record.pipeline import PipelineRecord, PipelineStep, UnsplitCheck
from .. import data, models, runtime
from ..parallel.pipeline import TransformerStage, build_schedule, build_stage, stage_blocks, token_mean_loss
from ..probes.pipeline import LiveSavedBytes, StageRecorder
from ..training import torch_dtype
from .. import clock


def run(ctx):
    """Run every (schedule, m) on this stage; return (PipelineRecord, no tensors)."""
    exp, task, device, group, log = ctx.exp, ctx.exp.task, ctx.device, ctx.group, ctx.log
    stages, stage = exp.world_size, ctx.rank
    log.enter("build")
    full = models.build(exp).to(device=device, dtype=torch_dtype(exp.dtype))
    x, y = (t.to(device) for t in data.batch(exp.seed, list(range(task.global_batch)), exp.seq_len, exp.vocab_size))
    module = TransformerStage(full, stage, stages)
    names = [n for n, _ in module.named_parameters()]

    log.enter("reference")
    reference_loss = token_mean_loss(full(x), y)
    reference_loss.backward()
    reference = {n: p.grad.detach().clone() for n, p in module.named_parameters()}
    full.zero_grad(set_to_none=True)

    meter = LiveSavedBytes(module.parameters())
    arms = {}
    for combo in task.combos(exp):
        pipe_stage = build_stage(module, stage, stages, device, group)
        recorder = StageRecorder(pipe_stage, meter, device, token_mean_loss)
        arms[combo] = (build_schedule(combo[0], pipe_stage, combo[1], recorder.loss_fn), recorder)

    def step(combo, round_: int, recorded: bool = True) -> tuple[PipelineStep, list]:
        schedule, recorder = arms[combo]
        losses: list = []
        gc.disable()   # a collection inside a step would stall this stage for milliseconds
        try:
            dist.barrier(group=group)
            barrier_ns = clock.now_ns()
            recorder.start(on=recorded)
            with meter if recorded else contextlib.nullcontext():
                if module.first:
                    schedule.step(x, return_outputs=False)
                elif module.last:
                    schedule.step(target=y, losses=losses, return_outputs=False)
                else:
                    schedule.step(return_outputs=False)
        finally:
            recorder.stop()
            gc.enable()
        return PipelineStep(combo[0], combo[1], round_, barrier_ns, recorder.ops, meter.peak_bytes,
                            recorder.peak_in_flight), losses

    checks, steps = [], []
    for combo in arms:
        # warm-up first, unmetered: a schedule's first step also learns the stages' shapes (it runs the
        # stage and the loss once more, and keeps what that forward saved)
        log.enter("check", detail=f"{combo[0]} m={combo[1]}")
        step(combo, -1, recorded=False)
        module.zero_grad(set_to_none=True)
        checked, losses = step(combo, -1)
        checks.append(_compare(combo, module, reference, reference_loss, losses))
        steps.append(checked)
        module.zero_grad(set_to_none=True)

    combos = list(arms)
    for r in range(task.rounds):
        for position, combo in enumerate(combos if r % 2 == 0 else combos[::-1]):
            log.enter("round", r, position, detail=f"{combo[0]} m={combo[1]}")
            steps.append(step(combo, r)[0])
            module.zero_grad(set_to_none=True)

    record = PipelineRecord(stage=stage, stages=stages, blocks=stage_blocks(exp.n_layers, stages, stage),
                            parameter_names=names,
                            parameter_bytes=sum(p.numel() * p.element_size() for p in module.parameters()),
                            global_batch=task.global_batch, checks=checks, steps=steps,
                            cores=runtime.cores())
    return record, {}


def _compare(combo, module, reference, reference_loss, losses) -> UnsplitCheck:
    """This stage's gradient (and the last stage's loss) after one step, against the unsplit model's."""
    errors, scale = [0.0], [0.0]
    for n, p in module.named_parameters():
        errors.append(float((p.grad - reference[n]).abs().max()))
        scale.append(float(reference[n].abs().max()))
    loss = float(torch.stack([l.detach() for l in losses]).mean()) if losses else None
    return UnsplitCheck(combo[0], combo[1], loss, float(reference_loss), max(errors), max(scale))
