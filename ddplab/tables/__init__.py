"""Views: pandas tables of finished runs, one module per concept, in the lab's vocabulary and units.
Nothing here launches ranks or imports rank code; torch loads only to read saved tensors.

    ranks (00), gradients (01, 06), memory (02), comm (03, 05), readiness (04),
    bucket_sweep and buckets (05: the sweep as measured; the simulator beside it), global_batch (06),
    stats (the robust spread and round summary every timing view shares),
    stragglers, traces and balance (07: who waits for whom; the profiler's traces and memory timeline;
    equal tokens against cost-balanced batching), failures, coverage, resume and common_errors (08: the failure lab, DistributedSampler's
    coverage of the data set, resuming from a checkpoint, the four common errors; as `tables.<module>.*`), fsdp_memory, tensor_parallel and pipeline (09: FSDP2 memory over
    one step and the ZeRO model, a layer split over ranks and the dp x tp mesh, pipeline schedules and their bubble),
    compression (10: DDP's communication hooks, their bytes, their effect on learning, whether they pay),
    compiled_ddp (11: DDPOptimizer's split, readiness and the step under torch.compile)

The chapters' tables are at hand as `tables.<name>(run)`, and the key checks of notebooks 01, 02 and 06
as `tables.verify_*` (they raise `verify.CheckFailed`; tests/views/test_key_checks.py makes each fail). Used by
every notebook.
"""

from .balance import (balance_assignment, balance_calibration, balance_fit, balance_timing, balance_verdict,
                      imbalance, verify_cost_explains_imbalance)
from .comm import allreduce_sweep, bytes_on_wire, compute_vs_comm, fit_summary, fit_sweep
from .global_batch import (accumulation, batch_size_study, examples_per_step, examples_seen, loss_by_examples, scaling,
                           verify_distinct_examples)
from .gradients import gradient_check, gradient_values, normalization, verify_global_batch_gradient
from .memory import (memory_cuda, memory_table, memory_moments, memory_sweep, moments_sweep, predicted_moments, sharding,
                     verify_model_state)
from .ranks import id_ranges, rank_table, reference, steps
from . import common_errors, common_errors_summary, compiled_ddp, compression, coverage, failures, fsdp_memory, pipeline, pipeline_steps, resume, tensor_parallel
from .readiness import bucket_timeline, dependency_tail, exposed_vs_summed, off_line, ready_order
from .traces import hta_analysis, memory_timeline, memory_timeline_peaks, trace_events, trace_folder

__all__ = ["common_errors", "common_errors_summary", "compiled_ddp", "compression", "coverage", "failures", "fsdp_memory", "pipeline", "pipeline_steps", "resume", "tensor_parallel", "accumulation", "allreduce_sweep", "balance_assignment", "balance_calibration", "balance_fit", "imbalance", "verify_cost_explains_imbalance",
           "balance_timing", "balance_verdict", "batch_size_study", "bucket_timeline", "bytes_on_wire",
           "compute_vs_comm", "dependency_tail", "examples_per_step", "examples_seen", "exposed_vs_summed", "fit_summary", "fit_sweep", "gradient_check", "gradient_values", "hta_analysis",
           "id_ranges", "loss_by_examples", "memory_cuda", "memory_table", "memory_moments", "memory_sweep", "memory_timeline",
           "memory_timeline_peaks", "moments_sweep",
           "normalization", "off_line", "predicted_moments", "rank_table",
           "ready_order", "reference", "scaling", "sharding", "steps", "trace_events", "trace_folder",
           "verify_distinct_examples", "verify_global_batch_gradient", "verify_model_state"]


def _said_plainly(name: str, table):
    """The last resort behind the declared checks (`tables/reads.py`): a table that still fails inside
    on a run it cannot read (a probe it needs but does not declare) says so as a ValueError naming the
    table, the run's task and its probes, instead of the AttributeError or TypeError deep inside."""
    import functools
    import inspect

    signature = inspect.signature(table)

    @functools.wraps(table)
    def call(*args, **kwargs):
        signature.bind(*args, **kwargs)   # a wrong call is the caller's TypeError, as it is
        try:
            return table(*args, **kwargs)
        except (AttributeError, TypeError, KeyError, IndexError) as e:
            given = [*args, *kwargs.values()]
            runs = [a for a in given for a in (a if isinstance(a, (list, tuple)) else [a]) if hasattr(a, "spec")]
            if not runs:
                raise
            said = "; ".join(f"{r.spec.name!r} is a {r.spec.task.kind} run with probes "
                             f"{', '.join(r.spec.probes) or 'none'}" for r in runs[:3])
            need = (table.__doc__ or "").strip().split("\n")[0]
            raise ValueError(f"tables.{name} cannot read this: {said}. It shows: {need} Pass the run it is for "
                             f"(the recipe of its chapter makes it, with the probes it needs). "
                             f"[{type(e).__name__}: {e}]") from e
    return call


def _check_every_table() -> None:
    """Every public table of every module here checks what it reads before it runs (`reads.checked`),
    both as `tables.<name>` and as `tables.<module>.<name>`; `tables.<name>` also gets `_said_plainly`."""
    import importlib
    import inspect
    import pkgutil

    from .reads import checked

    for info in pkgutil.iter_modules(__path__):
        if info.name == "reads":
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for n, f in list(vars(module).items()):
            if inspect.isfunction(f) and f.__module__ == module.__name__ and not n.startswith("_"):
                setattr(module, n, checked(f"tables.{info.name}.{n}", module, f))
    g = globals()
    for name in __all__:
        table = g[name]
        if inspect.isfunction(table) and table.__module__.startswith(f"{__name__}."):
            module = importlib.import_module(table.__module__)
            g[name] = _said_plainly(name, checked(f"tables.{name}", module, table))


_check_every_table()
