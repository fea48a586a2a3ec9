"""The resume task (notebook 08): checkpoint a DDP run in the middle, resume it in a new launch, and
measure where and how far the resumed trajectory departs from the uninterrupted one.

    Resume(dataset_size=32, augment_p=0.1)                           # the uninterrupted run
    Resume(dataset_size=32, augment_p=0.1, save_at=6)                # the same, stopped after 6 steps
    Resume(dataset_size=32, augment_p=0.1, resume_from="runs/.../saved-<hash>")          # the right resume
    Resume(..., resume_from=..., restore=("model", "sampler", "rng"))                     # optimizer lost
    Resume(..., resume_from=..., sampler_position="per-rank")        # world size changed, position not

A training run's state is more than its parameters: the optimizer's state (Adam's moments and step
count), where the sampler is (epoch, and how far into it) and the random stream (here: which input
tokens the augmentation replaces). Model and optimizer go through torch.distributed.checkpoint (DCP);
the rest is each rank's own small file. The sampler is torch's `DistributedSampler` over the ids
0..dataset_size-1 (shuffle=True, seed=Experiment.seed, drop_last=True): rank r takes positions r, r+W,
r+2W, ... of one permutation per epoch. So the position to restore is the number of examples the whole
world consumed in the epoch (`sampler_position="global"`), which each rank divides by the new world
size; a rank's own count (`"per-rank"`, what a stateful sampler stores) is right only while the world
size stays the same. Pure: no torch. The rank side is `rank/tasks/resume.py`, the views
`tables/resume.py`, the experiments `recipes/resume.py`.
Reference: https://pytorch.org/docs/stable/distributed.checkpoint.html
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .. import seal
from ..record.resume import ResumeRecord
from .checks import bad, is_int, is_number, reading
from .tasks import GRADIENT_ALL_REDUCE, MODEL_FIELDS, RUN_FIELDS, Phase, TaskSpec, register

RESTORABLE = ("model", "optimizer", "sampler", "rng")
SAMPLER_POSITIONS = ("global", "per-rank")
CHECKPOINT = "checkpoint"           # the folder inside the saving run's directory
MAX_DATASET_SIZE = 10 ** 5
# what must match between the saving run and a resume for the checkpoint to fit and the data to continue
SAME_MODEL = ("model", "vocab_size", "d_model", "n_layers", "n_heads", "tie_weights", "dtype", "seq_len", "seed")
SAME_OPTIMIZER = ("optimizer", "lr", "momentum")   # DCP restores the param groups' lr with the state


def checkpoint_dir(run_dir) -> Path:
    """Where a saving run's checkpoint lies: DCP's files (`.metadata`, `__<r>_0.distcp`) and each
    rank's own `rank{r}.state.pt`; sealed by `checkpoint.seal.json` beside it (`ddplab/seal.py`)."""
    return Path(run_dir) / CHECKPOINT


def rank_state_file(run_dir, rank: int) -> Path:
    """Rank r's own part of the checkpoint: its RNG state and its sampler position."""
    return checkpoint_dir(run_dir) / f"rank{rank}.state.pt"


def shard_size(dataset_size: int, world_size: int) -> int:
    """Ids one rank takes per epoch: DistributedSampler with drop_last=True, floor(N / W)."""
    return dataset_size // world_size


def steps_per_epoch(dataset_size: int, world_size: int, local_batch: int) -> int:
    """Full local batches in one rank's shard (a shorter last batch is dropped)."""
    return shard_size(dataset_size, world_size) // local_batch


@dataclass(frozen=True)
class SamplerPosition:
    """Where a run's sampler stands after some optimizer steps."""

    epoch: int
    rank_offset: int       # ids each rank has taken from its shard of this epoch
    epoch_consumed: int    # ids the whole world has taken in this epoch: rank_offset x world_size


def position_after(steps: int, dataset_size: int, world_size: int, local_batch: int) -> SamplerPosition:
    """The position of an uninterrupted run after `steps` optimizer steps (each epoch ends when a rank's
    shard holds no further full batch, so an epoch is `steps_per_epoch` steps)."""
    per_epoch = steps_per_epoch(dataset_size, world_size, local_batch)
    epoch, done = divmod(steps, per_epoch)
    if done == 0 and epoch > 0:   # the epoch just ended; the next step starts the next one
        epoch, done = epoch - 1, per_epoch
    return SamplerPosition(epoch, done * local_batch, done * local_batch * world_size)


# ---- the record: rank{r}.json's "result" -------------------------------------------------------
DCP_SAVE = ("collectives of dcp.save (its write plan's gather and scatter, then the commit of .metadata), then "
            "the barrier before rank 0 seals the checkpoint")
DCP_LOAD = "collectives of dcp.load (its read plan's gather and scatter)"


@register
@dataclass(frozen=True, kw_only=True)
class Resume(TaskSpec):
    """DDP training (Adam or any Experiment.optimizer) on `dataset_size` synthetic examples through a
    DistributedSampler, `local_batch` per rank per step, for `steps` optimizer steps over several epochs.
    `augment_p`: each input token is replaced by a random one with this probability, drawn from torch's
    global RNG seeded per rank at the start (0: no augmentation). `save_at`: after that many steps, write
    a checkpoint into the run directory and stop. `resume_from`: a saving run's directory; continue from
    its checkpoint, restoring what `restore` names (the rest starts afresh: a new optimizer, the sampler
    at epoch 0, the RNG reseeded). `sampler_position`: "global" (the examples the world consumed in the
    epoch over the new world size) or "per-rank" (the saved rank's own count, as it is)."""

    kind = "resume"
    runner = "ddplab.rank.tasks.resume:run"
    record = ResumeRecord
    phases = (Phase("build", 2), Phase("ddp-construct", 3, "broadcast of rank 0's parameters"),
              Phase("load-checkpoint", 4, DCP_LOAD), Phase("forward", 5), Phase("backward", 6, GRADIENT_ALL_REDUCE),
              Phase("optimizer", 7, ends_step=True), Phase("save-checkpoint", 8, DCP_SAVE, after_steps=True))
    reads = RUN_FIELDS | MODEL_FIELDS | {"steps", "optimizer", "lr", "momentum"}
    dataset_size: int = 32
    augment_p: float = 0.0
    save_at: int | None = None
    resume_from: str | None = None
    restore: tuple[str, ...] = RESTORABLE
    sampler_position: str = "global"

    def check(self, exp) -> None:
        for name in ("local_batch", "seq_len"):
            if not is_int(getattr(exp, name)):
                bad(name, f"the resume task gives every rank the same work: one {name} (got {getattr(exp, name)!r})")
        n = self.dataset_size
        if not is_int(n) or not 1 <= n <= MAX_DATASET_SIZE:
            bad("task.dataset_size", f"must be an integer in 1..{MAX_DATASET_SIZE} (got {n!r})")
        if n < exp.world_size * exp.local_batch:
            bad("task.dataset_size", f"{n} examples do not give each of world_size={exp.world_size} ranks one "
                                     f"local batch of {exp.local_batch} per epoch; use at least "
                                     f"{exp.world_size * exp.local_batch}")
        if not is_number(self.augment_p) or not 0 <= self.augment_p <= 1:
            bad("task.augment_p", f"a probability in [0, 1] (0: no augmentation) (got {self.augment_p!r})")
        if self.save_at is not None and (not is_int(self.save_at) or not 1 <= self.save_at < exp.steps):
            bad("task.save_at", f"the optimizer steps after which to checkpoint and stop: an integer in "
                                f"1..{exp.steps - 1} (steps - 1), or None (got {self.save_at!r})")
        if self.resume_from is not None and not isinstance(self.resume_from, str):
            bad("task.resume_from", f"a run directory (a string), or None (got {self.resume_from!r})")
        if self.save_at is not None and self.resume_from is not None:
            bad("task.save_at", "a run either saves a checkpoint (save_at) or resumes from one (resume_from), "
                                "not both; chain them as separate runs")
        restore = list(self.restore) if isinstance(self.restore, tuple) else None
        if restore is None or not all(r in RESTORABLE for r in restore) or len(set(restore)) != len(restore):
            bad("task.restore", f"distinct parts from {', '.join(RESTORABLE)} (got {self.restore!r})")
        if self.sampler_position not in SAMPLER_POSITIONS:
            bad("task.sampler_position", f"must be one of {', '.join(SAMPLER_POSITIONS)} "
                                         f"(got {self.sampler_position!r})")
        if self.save_at is not None and not reading() and "LOCAL_RANK" not in os.environ:
            try:   # rank 0 seals the checkpoint after training: a key it cannot use must stop the run before
                seal.check_key()
            except ValueError as e:
                bad("task.save_at", f"the checkpoint it saves is sealed with this account's key, and {e}")
        if self.resume_from is None:
            for name, default in (("restore", RESTORABLE), ("sampler_position", "global")):
                if getattr(self, name) != default:
                    bad(f"task.{name}", "says what a resume restores, and this run resumes nothing "
                                        "(resume_from is None); leave it at its default")
            return
        if "sampler" not in restore and self.sampler_position != "global":
            bad("task.sampler_position", "places the restored sampler, and restore leaves the sampler out; "
                                         "leave it at its default")
        if not reading():   # a finished resume reloads wherever its saving run went since
            # a rank rebuilds the spec the launcher checked in full, and checks its node's copy before it
            # loads (rank/tasks/resume.py): here it only checks the seal and the names, reading no file
            self.check_checkpoint(exp, digests="LOCAL_RANK" not in os.environ)

    def check_checkpoint(self, exp, digests: bool = True) -> None:
        """`resume_from` is a finished saving run whose checkpoint fits this experiment (ValueError naming
        `task.resume_from`, or the field that differs). digests=False (a rank rebuilding the spec) checks
        the seal and the file names but reads no file (seal.py)."""
        saved = self.saved_spec()
        task = saved.task
        where = f"the saving run {self.resume_from}"
        cp = checkpoint_dir(self.resume_from)
        missing = [p.name for p in [cp / ".metadata", *(rank_state_file(self.resume_from, r)
                                                        for r in range(saved.world_size))] if not p.exists()]
        if missing:
            bad("task.resume_from", f"{where} holds no complete checkpoint ({CHECKPOINT}/ lacks {', '.join(missing)}); "
                                    f"run it to the end (its save_at) first")
        try:   # before anything reads the folder: DCP unpickles it (seal.py)
            seal.verify(self.resume_from, cp, digests=digests)
        except ValueError as e:
            bad("task.resume_from", str(e))
        for name in SAME_MODEL + (SAME_OPTIMIZER if "optimizer" in self.restore else ()):
            if getattr(exp, name) != getattr(saved, name):
                fits = "the same optimizer settings" if name in SAME_OPTIMIZER else "the same model and data order"
                bad(name, f"differs from {where} ({getattr(exp, name)!r} here, {getattr(saved, name)!r} there); "
                          f"its checkpoint fits {fits} only")
        if self.dataset_size != task.dataset_size:
            bad("task.dataset_size", f"differs from {where} ({self.dataset_size} here, {task.dataset_size} there): "
                                     f"the sampler's position means nothing in another data set")
        if exp.steps <= task.save_at:
            bad("steps", f"the resume continues after step {task.save_at} of {where}: steps must be more than "
                         f"{task.save_at} (got {exp.steps})")
        if "rng" in self.restore and exp.world_size != saved.world_size:
            bad("task.restore", f"'rng' restores each rank's own random stream, and {where} had world_size="
                                f"{saved.world_size}, not {exp.world_size}; leave 'rng' out (augment_p=0 makes "
                                f"the streams irrelevant)")
        if "sampler" in self.restore and self.sampler_position == "global":
            at = position_after(task.save_at, task.dataset_size, saved.world_size, saved.local_batch)
            if at.epoch_consumed % exp.world_size:
                bad("task.sampler_position", f"{where} stopped {at.epoch_consumed} examples into epoch {at.epoch}, "
                                             f"which do not split evenly over world_size={exp.world_size} ranks")

    def saved_spec(self):
        """The saving run's Experiment, read from its spec.json (ValueError naming task.resume_from)."""
        from .experiment import Experiment   # the module that imports this one

        f = Path(self.resume_from) / "spec.json"
        try:   # a path the system cannot look up (too long, a NUL in it) is one more wrong directory
            found = f.is_file()
        except (OSError, ValueError) as e:
            why = getattr(e, "strerror", None) or e
            bad("task.resume_from", f"{self.resume_from[:80]!r} is not a path this system can open ({why})")
        if not found:
            bad("task.resume_from", f"{self.resume_from!r} is not a run directory (no spec.json there)")
        try:
            saved = Experiment.from_json(f.read_text())
        except (ValueError, OSError) as e:
            bad("task.resume_from", f"{f} is not a readable spec ({e})")
        if saved.task.kind != self.kind or saved.task.save_at is None:
            bad("task.resume_from", f"{self.resume_from} is not a saving run (a {self.kind} task with save_at); "
                                    f"its task is {saved.task.kind!r}"
                                    f"{' without save_at' if saved.task.kind == self.kind else ''}")
        return saved

    def start_step(self) -> int:
        """The first optimizer step this run trains: 0, or the saving run's save_at."""
        return 0 if self.resume_from is None else self.saved_spec().task.save_at

    def total_steps(self, exp) -> int:
        # a resume's progress counts the whole trajectory, so it starts at save_at
        return self.save_at if self.save_at is not None else exp.steps
