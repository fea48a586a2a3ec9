"""Views: matplotlib figures of finished runs and of the pure models, one module per concept, each called
as `plots.<module>.<figure>(...)`. Each function returns the Figure; nothing here launches ranks or
imports rank code.

    ranks (00), gradients (01), memory (02), comm (03, 05), readiness (04), buckets (05), global_batch (06),
    stragglers and traces (07), coverage and resume (08), fsdp_memory, tensor_parallel and pipeline (09),
    compression (10), compiled_ddp (11); canvas: where a figure is drawn (pyplot, or detached for a widget)
Used by every notebook.
"""

from . import (buckets, canvas, comm, compiled_ddp, compression, coverage, fsdp_memory, global_batch, gradients, memory,
               pipeline, ranks, readiness, resume, stragglers, tensor_parallel, traces)
