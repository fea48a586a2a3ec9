"""Notebook 09, pipeline parallelism: the transformer cut into 2 and into 4 stages, each run under
torch's GPipe and 1F1B schedules with m = 1, 2, 4, 8 microbatches of one global batch."""

from __future__ import annotations

from ..predict.pipeline import SCHEDULES
from ..spec import Experiment
from ..spec.pipeline import Pipeline

# 4 blocks split 2 + 2 or 1 + 1 + 1 + 1; a microbatch of 2 examples x 64 tokens (m = 8 of a global batch
# of 16) still takes a few ms a forward on one core, against a few tenths of a ms for a send on gloo;
# what a stage waits beyond that for the CPU is the bubble table's `waits`. A global batch of 32 would
# halve that share but double the cost of each of the rounds the claims need
PIPELINE_MODEL = dict(vocab_size=64, d_model=128, n_layers=4, n_heads=4, seq_len=64)
# the bubble's claims are judged on paired rounds by the sign test: under 10 rounds it judges nothing,
# from 10 to 13 its interval runs from the smallest to the largest round, so one step hit by a load spike
# leaves a claim unresolved; from 14 the interval leaves out one round at each end
PIPELINE_ROUNDS = 14


def pipeline_parallel(stages=(2, 4), schedules=SCHEDULES, microbatches=(1, 2, 4, 8),
                      rounds: int = PIPELINE_ROUNDS,
                      global_batch: int = 16, seed: int = 0, **overrides) -> list[Experiment]:
    """Notebook 09, one experiment per stage count ("pipeline-2-stages", "pipeline-4-stages") for one
    `ddplab.run_many` launch (the widest sets the ranks; the 2-stage one runs on ranks 0 and 1 first):
    every (schedule, m) checked against the unsplit model, then timed in `rounds` interleaved rounds
    (every (schedule, m) once a round, in alternating order: the rounds pair the arms for `claims`).
    Keyword arguments override Experiment fields (PIPELINE_MODEL's among them)."""
    model = {**PIPELINE_MODEL, **overrides}
    task = Pipeline(schedules=tuple(schedules), microbatches=tuple(microbatches), rounds=rounds,
                    global_batch=global_batch)
    return [Experiment(name=f"pipeline-{p}-stages", world_size=p, seed=seed, task=task, **model) for p in stages]
