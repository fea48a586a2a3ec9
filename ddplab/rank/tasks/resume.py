"""The resume task (`Resume`, notebook 08): a short DDP training script that can checkpoint after
`save_at` steps and stop, and, in a new launch, resume from that checkpoint.

What a checkpoint holds, and where:
- model and optimizer: torch.distributed.checkpoint (DCP). `get_state_dict(ddp, optimizer)` gives both
  keyed by parameter name (DDP's `module.` prefix stripped, the optimizer's state keyed by name, not by
  position); `dcp.save` writes every replicated tensor once, spread over the ranks' `__<r>_0.distcp`
  files, and rank 0 commits `.metadata`; `dcp.load` fills the tensors it is handed, in place, whatever
  the world size that wrote them.
- `rank{r}.state.pt`: what is this rank's own: its CPU random state (the augmentation's stream) and its
  sampler position (epoch, ids taken from its shard, ids the world took in the epoch).
A resume restores what `task.restore` names; the rest starts afresh, as a resume that forgot it would:
a new optimizer, the sampler at epoch 0, the RNG reseeded as at the start. Runs inside a rank.
Reference: https://pytorch.org/docs/stable/distributed.checkpoint.html
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_optimizer_state_dict, get_state_dict,
                                                     set_model_state_dict, set_optimizer_state_dict)
from torch.utils.data import DistributedSampler

from ... import seal
from ...rundir import final_dir, save_tensors_atomic
from ...record.resume import CheckpointInfo, ResumeRecord, ResumeStep
from ...spec.resume import CHECKPOINT, checkpoint_dir, rank_state_file
from .. import data, models
from ..parallel.ddp import wrap_in_ddp
from ..runtime import Clock, rank_env
from ..training import flat_parameters, make_optimizer, parameter_checksum, token_losses, torch_dtype

AUGMENT_STREAM = 1_000_003   # rank r's augmentation stream is seeded with seed + AUGMENT_STREAM x (r + 1)


def run(ctx):
    """Train steps start..end-1 (resume, then save if asked); return (ResumeRecord, rank 0's parameters
    after every step as `params`, one row per step in `steps`)."""
    exp, task, rank, log = ctx.exp, ctx.exp.task, ctx.rank, ctx.log
    log.enter("build")
    model = models.build(exp).to(device=ctx.device, dtype=torch_dtype(exp.dtype))
    log.enter("ddp-construct")
    ddp = wrap_in_ddp(model, ctx.device, ctx.group)
    optimizer = make_optimizer(exp, ddp.parameters())
    torch.manual_seed(exp.seed + AUGMENT_STREAM * (rank + 1))   # after build, which seeds the RNG itself
    sampler = DistributedSampler(range(task.dataset_size), num_replicas=exp.world_size, rank=rank, shuffle=True,
                                 seed=exp.seed, drop_last=True)
    start, epoch, offset, resumed = 0, 0, 0, None
    if task.resume_from is not None:
        start = task.start_step()
        log.enter("load-checkpoint", start)
        resumed, epoch, offset = restore(ctx, ddp, optimizer)
    start_epoch, start_offset = epoch, offset
    sampler.set_epoch(epoch)   # reseeds the shuffle with seed + epoch
    shard = list(sampler)      # this rank's ids of the epoch: positions rank, rank + W, ... of one permutation
    end = task.save_at if task.save_at is not None else exp.steps
    clock, steps, params = Clock(ctx.device), [], []
    for step in range(start, end):
        clock.mark("start")
        if offset + exp.local_batch > len(shard):   # no full batch left: the next epoch
            epoch, offset = epoch + 1, 0
            sampler.set_epoch(epoch)
            shard = list(sampler)
        ids = shard[offset:offset + exp.local_batch]
        offset += exp.local_batch
        x, y = data.batch(exp.seed, ids, exp.seq_len, exp.vocab_size)
        x, augmented = augment(x, task.augment_p, exp.vocab_size)
        x, y = x.to(ctx.device), y.to(ctx.device)
        log.enter("forward", step)
        losses = token_losses(ddp(x), y)
        loss = losses.mean()
        log.enter("backward", step)
        loss.backward()                    # DDP averages the ranks' gradients: the global batch's mean
        log.enter("optimizer", step)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        clock.mark("step")
        steps.append(ResumeStep(step=step, epoch=epoch, sample_ids=ids, loss=loss.item(),
                                loss_sum=losses.sum().item(), tokens=y.numel(), augmented=augmented,
                                param_checksum=parameter_checksum(model), step_ms=sum(clock.durations_ms().values())))
        if rank == 0:
            params.append(flat_parameters(model))
    saved = None
    if task.save_at is not None:
        log.enter("save-checkpoint", end - 1)
        saved = save(ctx, ddp, optimizer, end, epoch, offset)
    record = ResumeRecord(start_step=start, start_epoch=start_epoch, start_offset=start_offset,
                          restored=list(task.restore) if resumed else [], saved=saved, resumed=resumed, steps=steps)
    tensors = {"params": torch.stack(params), "steps": torch.tensor([s.step for s in steps])} if rank == 0 else {}
    return record, tensors


def augment(x: torch.Tensor, p: float, vocab_size: int) -> tuple[torch.Tensor, int]:
    """Replace each input token by a random one with probability p, drawn from torch's global CPU RNG
    (the stream a resume must restore); (the inputs, how many were replaced)."""
    if p == 0:
        return x, 0
    replace = torch.rand(x.shape) < p
    return torch.where(replace, torch.randint(vocab_size, x.shape), x), int(replace.sum())


def save(ctx, ddp, optimizer, step: int, epoch: int, offset: int) -> CheckpointInfo:
    """Write the checkpoint after `step` optimizer steps: DCP for model and optimizer (a collective),
    then this rank's own file (its RNG state first: nothing may draw from it in between); once every
    rank has written, rank 0 seals the folder (`ddplab/seal.py`: a resume reads only what was sealed)."""
    exp = ctx.exp
    own = {"step": step, "epoch": epoch, "rank_offset": offset, "epoch_consumed": offset * exp.world_size,
           "world_size": exp.world_size, "local_batch": exp.local_batch, "rng": torch.get_rng_state()}
    clock = Clock(ctx.device)
    clock.mark("start")
    model_state, optimizer_state = get_state_dict(ddp, optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=checkpoint_dir(ctx.run_dir),
             process_group=ctx.group)
    clock.mark("save")
    save_tensors_atomic(rank_state_file(ctx.run_dir, ctx.rank), own)
    torch.distributed.barrier(group=ctx.group)   # every rank's files are written: rank 0 seals them all
    if ctx.rank == 0:
        seal.sign(ctx.run_dir, checkpoint_dir(ctx.run_dir))
    return _info(ctx.run_dir, own, clock.durations_ms()["save"])


def restore(ctx, ddp, optimizer) -> tuple[CheckpointInfo, int, int]:
    """Load what `task.restore` names from `task.resume_from`; (what was read, epoch, offset into this
    rank's shard) for the sampler. DCP loads into the state dicts in place; set_*_state_dict puts them
    into the model and the optimizer (its state, step count and param groups)."""
    source = ctx.exp.task.resume_from
    copy = verified_copy(ctx, source)
    try:
        restored = _restore_from(ctx, ddp, optimizer, source, copy)
        torch.distributed.barrier(group=ctx.group)   # every rank has read the copy (the rng/sampler-only case too)
        return restored
    finally:
        if rank_env().local_rank == 0:
            shutil.rmtree(copy.parent, ignore_errors=True)


COPY_WAIT_S = 600.0   # how long a node's other ranks wait for its copier to copy and hash the checkpoint


def verified_copy(ctx, source) -> Path:
    """The checkpoint of `source`, copied once per node into this launch's own directory and verified
    against its seal there (seal.py): the ranks load that copy, so nothing can change what they read
    between the check and the load, and the files are hashed once per node, not once per rank. The
    lowest rank of each node copies; the node's other ranks wait for its word in a file (not in a
    collective, whose timeout a large checkpoint could outlast). A copy that fails the check is
    deleted and refused on every rank of the node, saying why."""
    node = rank_env().node
    here = Path(ctx.run_dir) / f".resume-source-node{node}"
    copy, verified, refused = here / CHECKPOINT, here / "verified", here / "refused"
    if rank_env().local_rank == 0:
        try:
            shutil.rmtree(here, ignore_errors=True)
            here.mkdir(mode=0o700, parents=True)
            shutil.copytree(checkpoint_dir(source), copy, symlinks=True)
            seal.verify(source, checkpoint_dir(source), read_from=copy)
            verified.write_text("")
        except (ValueError, OSError) as e:
            shutil.rmtree(copy, ignore_errors=True)
            here.mkdir(mode=0o700, parents=True, exist_ok=True)
            refused.write_text(f"{type(e).__name__}: {e}")
    else:
        deadline = time.monotonic() + max(COPY_WAIT_S, ctx.exp.timeout_s)
        while not (verified.exists() or refused.exists()) and time.monotonic() < deadline:
            time.sleep(0.02)
    if not verified.exists():
        why = refused.read_text() if refused.exists() else f"no copy was made on this node within {COPY_WAIT_S:g} s"
        raise ValueError(f"task.resume_from: the checkpoint of {source} could not be copied and verified on node "
                         f"{node} before it was loaded ({why}); nothing of it was loaded")
    return copy


def _restore_from(ctx, ddp, optimizer, source, copy: Path) -> tuple[CheckpointInfo, int, int]:
    exp, task = ctx.exp, ctx.exp.task
    rank_file = rank_state_file(source, ctx.rank if ctx.rank < task.saved_spec().world_size else 0)
    own = torch.load(copy / rank_file.name, weights_only=True)
    clock = Clock(ctx.device)
    clock.mark("start")
    state = {}
    if "model" in task.restore:
        state["model"] = get_model_state_dict(ddp)
    if "optimizer" in task.restore:   # a fresh optimizer's state is made here (a step at lr 0), then replaced
        state["optimizer"] = get_optimizer_state_dict(ddp, optimizer)
    if state:
        dcp.load(state, checkpoint_id=copy, process_group=ctx.group)
    if "model" in state:
        set_model_state_dict(ddp, state["model"])
    if "optimizer" in state:
        set_optimizer_state_dict(ddp, optimizer, state["optimizer"])
    clock.mark("load")
    if "rng" in task.restore:
        torch.set_rng_state(own["rng"])
    epoch, offset = 0, 0
    if "sampler" in task.restore:
        epoch = own["epoch"]
        # the world's count over the new world size is right at any world size; a rank's own count is
        # right only at the one it was counted in
        offset = own["epoch_consumed"] // exp.world_size if task.sampler_position == "global" else own["rank_offset"]
    return _info(source, own, clock.durations_ms()["load"]), epoch, offset


def _info(run_dir, own: dict, ms: float) -> CheckpointInfo:
    cp = checkpoint_dir(run_dir)
    dcp_bytes = sum(f.stat().st_size for f in cp.iterdir() if f.name == ".metadata" or f.suffix == ".distcp")
    # the path it will have once the launch settles: a run writes inside its staging directory
    return CheckpointInfo(path=str(final_dir(cp)), step=own["step"], epoch=own["epoch"], rank_offset=own["rank_offset"],
                          epoch_consumed=own["epoch_consumed"], world_size=own["world_size"],
                          local_batch=own["local_batch"], dcp_bytes=dcp_bytes, ms=ms)
