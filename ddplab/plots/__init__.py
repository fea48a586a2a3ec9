"""Views: matplotlib figures of finished runs and of the pure models, one module per concept. Each
function returns the Figure; nothing here launches ranks or imports rank code.

    ranks (00), gradients (01), memory (02), comm (03, 05), readiness (04), buckets (05), global_batch (06),
    stragglers and traces (07), coverage and resume (08), fsdp_memory, tensor_parallel and pipeline (09), compression (10), compiled_ddp (11), as
    `plots.<module>.*` from chapter 08 on
Used by every notebook.
"""

from . import compiled_ddp, compression, coverage, fsdp_memory, pipeline, resume, tensor_parallel
from .buckets import ready_curve, sweep_comparison, timeline, timelines
from .comm import allreduce_fit, compute_vs_comm
from .global_batch import batch_size_study, scaling
from .gradients import gradient_check, normalization_errors, rank_weights
from .memory import memory_figure, memory_prediction, memory_sweep
from .ranks import sample_ownership, step_times, update_error
from .readiness import backward_timeline, ready_order
from .traces import trace_timeline

__all__ = ["compiled_ddp", "compression", "coverage", "fsdp_memory", "pipeline", "resume", "tensor_parallel", "allreduce_fit", "backward_timeline", "batch_size_study", "compute_vs_comm", "gradient_check", "memory_figure",
           "memory_prediction", "memory_sweep", "normalization_errors", "rank_weights", "ready_curve", "ready_order", "sample_ownership",
           "scaling", "step_times", "sweep_comparison", "timeline", "timelines", "trace_timeline", "update_error"]
