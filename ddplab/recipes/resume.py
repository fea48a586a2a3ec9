"""Notebook 08, resume: checkpoint in the middle of a run, resume in a new launch, and the classic broken
resumes. Staged, since a resume needs the saving run's directory:

    uninterrupted, saved, uninterrupted4, saved4 = ddplab.run_many(resume_baseline() + world_size_baseline())
    runs = ddplab.run_many(resumes(saved) + world_size_resumes(saved4))    # a new launch

Every experiment is small (a 1-layer transformer, 10 Adam steps of 8 examples, 4 steps an epoch over
32 examples) so the section's two launches take seconds.
"""

from __future__ import annotations

from pathlib import Path

from ..spec import Experiment
from ..spec.resume import Resume

RESUME_MODEL = dict(d_model=32, n_layers=1, n_heads=2, seq_len=16, vocab_size=64, optimizer="adam", lr=3e-3, steps=10)
DATASET_SIZE = 32


def resume_baseline(world_size: int = 2, local_batch: int = 4, save_at: int = 6, augment_p: float = 0.1,
                    dataset_size: int = DATASET_SIZE, **overrides) -> list[Experiment]:
    """Notebook 08: "uninterrupted" (every step in one go) and "saved" (the same run, checkpointed after
    `save_at` steps, in the middle of an epoch, and stopped), with the augmentation on so the random
    stream matters; both on `world_size` ranks, for one `ddplab.run_many` launch."""
    fields = dict(RESUME_MODEL, world_size=world_size, local_batch=local_batch, **overrides)
    task = dict(dataset_size=dataset_size, augment_p=augment_p)
    return [Experiment(name="uninterrupted", task=Resume(**task), **fields),
            Experiment(name="saved", task=Resume(save_at=save_at, **task), **fields)]


def world_size_baseline(world_size: int = 4, local_batch: int = 2, save_at: int = 6, **overrides) -> list[Experiment]:
    """Notebook 08: the same pair on `world_size` ranks with the augmentation off (each rank's random
    stream has no counterpart on another world size), named "uninterrupted-w{W}" and "saved-w{W}"."""
    return [e.replace(name=f"{e.name}-w{world_size}")
            for e in resume_baseline(world_size, local_batch, save_at, augment_p=0.0, **overrides)]


def resumes(saved, **overrides) -> list[Experiment]:
    """Notebook 08: four resumes of the saving run `saved` (a Run or its directory), on its world size:
    "resume-right" (everything restored), "resume-no-optimizer" (a fresh optimizer), "resume-epoch-0"
    (the sampler from epoch 0, position 0) and "resume-no-rng" (the augmentation's stream reseeded)."""
    parts = {"right": ("model", "optimizer", "sampler", "rng"), "no-optimizer": ("model", "sampler", "rng"),
             "epoch-0": ("model", "optimizer", "rng"), "no-rng": ("model", "optimizer", "sampler")}
    return [_resume(saved, f"resume-{name}", restore=restore, **overrides) for name, restore in parts.items()]


def world_size_resumes(saved, world_size: int = 2, **overrides) -> list[Experiment]:
    """Notebook 08: resume the saving run `saved` on `world_size` ranks with the same global batch (a
    bigger local batch): "resume-adjusted-w{W}" places the sampler at the examples the old world consumed
    over the new world size, "resume-unadjusted-w{W}" reuses the old rank's own count."""
    spec = _saved_spec(saved)
    if spec.global_batch % world_size:
        raise ValueError(f"world_size_resumes: the global batch {spec.global_batch} does not split evenly over "
                         f"{world_size} ranks")
    fields = dict(world_size=world_size, local_batch=spec.global_batch // world_size, **overrides)
    restore = ("model", "optimizer", "sampler")   # each rank's random stream has no counterpart here
    return [_resume(saved, f"resume-{how}-w{world_size}", restore=restore, sampler_position=position, **fields)
            for how, position in (("adjusted", "global"), ("unadjusted", "per-rank"))]


def _resume(saved, name: str, restore, sampler_position: str = "global", **overrides) -> Experiment:
    spec, path = _saved_spec(saved), _path(saved)
    task = Resume(dataset_size=spec.task.dataset_size, augment_p=spec.task.augment_p, resume_from=str(path),
                  restore=restore, sampler_position=sampler_position)
    return spec.replace(name=name, task=task, **overrides)


def _path(saved) -> Path:
    return Path(getattr(saved, "path", saved)).resolve()   # the ranks resolve it from any directory


def _saved_spec(saved) -> Experiment:
    spec = getattr(saved, "spec", None)
    if spec is None:
        spec = Resume(resume_from=str(_path(saved))).saved_spec()
    if spec.task.kind != Resume.kind or spec.task.save_at is None:
        raise ValueError(f"saved: {_path(saved)} is not a saving run (a resume task with save_at)")
    return spec
