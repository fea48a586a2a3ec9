"""Views: pandas tables of finished runs, one module per concept, in the lab's vocabulary and units,
each called as `tables.<module>.<table>(run)`. Nothing here launches ranks or imports rank code; torch
loads only to read saved tensors. Each table declares the runs it reads on its own def
(`tables/reads.py`), and is checked against them before it runs.

    ranks (00), gradients (01, 06), memory (02), comm (03, 05), readiness (04),
    bucket_sweep and buckets (05: the sweep as measured; the simulator beside it), global_batch (06),
    stats (the robust spread and round summary every timing view shares),
    stragglers, traces and balance (07: who waits for whom; the profiler's traces and memory timeline;
    equal tokens against cost-balanced batching),
    failures, coverage, resume and common_errors (08: a failure and its diagnosis, DistributedSampler's
    coverage of the data set, resuming from a checkpoint, the four common errors side by side; each
    error's own table lives with its concept: global_batch, memory, readiness),
    fsdp_memory, tensor_parallel, pipeline and pipeline_timing (09: FSDP2 memory over one step and the
    ZeRO model, a layer split over ranks and the dp x tp mesh, pipeline schedules and their bubble, one
    pipeline step timed),
    compression (10: DDP's communication hooks, their bytes, their effect on learning, whether they pay),
    compiled_ddp (11: DDPOptimizer's split, readiness and the step under torch.compile)

The key checks of notebooks 01 and 02 are `gradients.verify_global_batch_gradient` and
`memory.verify_model_state` (they raise `verify.CheckFailed`; tests/views/test_key_checks.py makes each
fail). Used by every notebook.
"""

from . import (balance, bucket_sweep, buckets, comm, common_errors, compiled_ddp, compression, coverage, failures,
               fsdp_memory, global_batch, gradients, memory, pipeline, pipeline_timing, plan, ranks, readiness, resume,
               stats, stragglers, tensor_parallel, traces)
