"""Notebook 09, beyond DDP: every experiment of the chapter for one 4-rank `ddplab.run_many` launch
(FSDP2 memory over one step, ZeRO's stages measured, the layers split by tensor parallelism and the
2 x 2 mesh, the pipeline at 2 and 4 stages). A launch costs seconds on its own; one holds them all."""

from __future__ import annotations

from ..spec import Experiment
from .fsdp_memory import fsdp_configs, zero_stages_measured
from .pipeline import PIPELINE_ROUNDS, pipeline_parallel
from .tensor_parallel import TP_ROUNDS, tensor_parallel_runs


def beyond_ddp_runs(world_size: int = 4, rounds: int = TP_ROUNDS, pipeline_rounds: int = PIPELINE_ROUNDS) -> list[Experiment]:
    """The chapter's experiments: tensor parallelism and the 2 x 2 mesh (`tensor_parallel_runs`, `rounds`
    timed rounds of 3 steps, enough for the split-against-dense verdicts), FSDP2
    memory (`fsdp_memory`), ZeRO stages 0/1/3 (`zero_stages_measured`), the pipeline (`pipeline_parallel`,
    `pipeline_rounds` timed rounds of every schedule and microbatch count, enough for its timing claims).
    Every one runs on 4 ranks but tp = 2 and the 2-stage pipeline, which run on ranks 0 and 1."""
    return (tensor_parallel_runs(rounds=rounds) + [fsdp_configs(world_size)]
            + zero_stages_measured(world_size) + pipeline_parallel(rounds=pipeline_rounds))
