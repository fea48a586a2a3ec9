"""Named experiments, one module per chapter, one function per experiment; variants derive with
`Experiment.replace`. Each function returns an `Experiment` (or a list) and runs nothing; keyword
arguments override any field. Used by the notebooks, the CLI and the tests.

    launch_and_ranks (00), synchronized_gradient (01), replicated_memory (02), communication (03),
    gradient_readiness (04), buckets_and_overlap (05), global_batch (06), stragglers (07),
    failures, coverage, resume and common_errors (08), beyond_ddp (all of 09 in one launch), fsdp_memory,
    tensor_parallel and pipeline (09), compression (10), compiled_ddp (11), at_scale (12)
"""

from .at_scale import SEVEN_B, plan_spec, real_runs
from .beyond_ddp import beyond_ddp_runs
from .buckets_and_overlap import BUCKET_MODEL, ONE_PER_PARAMETER_MB, bucket_sweep, split_on_link
from .common_errors import common_error_groups, common_error_runs
from .coverage import data_coverage
from .failures import fault_runs, find_unused_cost, unused_parameter_fixes
from .fsdp_memory import fsdp_configs, zero_stages_measured
from .pipeline import pipeline_parallel
from .tensor_parallel import dp_tp_mesh, split_layers, tensor_parallel_runs
from .compression import HOOK_MODEL, hook_comparison
from .compiled_ddp import COMPILE_MODEL, eager_and_compiled
from .communication import COMM_MODEL, allreduce_sweep, bytes_on_wire, local_batch_sweep
from .global_batch import SCALING_MODEL, accumulation, batch_size_study, strong_scaling, weak_scaling
from .gradient_readiness import backward_trace, readiness_cases
from .launch_and_ranks import crash, first_launch, skip_backward
from .replicated_memory import MEMORY_MODEL, memory_sweeps, memory_ledger, sharding_preview
from .resume import resume_baseline, resumes, world_size_baseline, world_size_resumes
from .stragglers import STRAGGLER_MODEL, balance_study, delay_sweep, profiled, straggler_runs
from .synchronized_gradient import gradient_run, unequal_work

__all__ = ["BUCKET_MODEL", "COMM_MODEL", "HOOK_MODEL", "hook_comparison", "COMPILE_MODEL", "eager_and_compiled", "MEMORY_MODEL", "ONE_PER_PARAMETER_MB", "SCALING_MODEL", "STRAGGLER_MODEL",
           "accumulation", "allreduce_sweep", "backward_trace", "batch_size_study", "bucket_sweep", "split_on_link", "bytes_on_wire", "crash",
           "balance_study", "delay_sweep", "profiled", "straggler_runs",
           "first_launch", "local_batch_sweep", "memory_sweeps", "readiness_cases", "memory_ledger",
           "sharding_preview", "skip_backward", "strong_scaling", "gradient_run", "unequal_work",
           "weak_scaling", "common_error_groups", "common_error_runs", "data_coverage", "fault_runs", "find_unused_cost", "unused_parameter_fixes",
           "resume_baseline", "resumes", "world_size_baseline", "world_size_resumes", "fsdp_configs", "zero_stages_measured",
           "beyond_ddp_runs", "pipeline_parallel", "dp_tp_mesh", "split_layers", "tensor_parallel_runs", "SEVEN_B",
           "plan_spec", "real_runs"]
