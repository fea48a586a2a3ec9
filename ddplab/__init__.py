"""ddplab: a hands-on lab for data-parallel training with real torchrun ranks.

    import ddplab
    from ddplab import recipes, tables
    run = ddplab.run(recipes.first_launch(world_size=4, local_batch=16))
    tables.ranks.rank_table(run)

Importing ddplab is cheap: every rank imports it, so heavy modules (torch, pandas) load on use.

The tree follows a run's data flow and shows where code runs: `spec/` (the Experiment, no torch) ->
`launch/` (the parent side: torchrun, watching) -> `rank/` (inside each torchrun rank: the worker,
tasks, probes, parallelism wrappers) -> `record/` / `rundir.py` (the files ranks write) ->
`results.py` (`Run`) -> `tables/`, `plots/`, `widgets/` (views); `predict/` holds the pure models
(cost formulas, the bucket simulator, the memory model) that notebooks put beside measurements.
"""

from . import releases

releases.require_supported(releases.installed_torch())   # an older torch is said here, not mid-lesson

from .failures import RunFailed  # noqa: E402
from .spec import Experiment  # noqa: E402
from .spec.model import ModelWithData  # noqa: E402
from .spec.plan import PlanSpec  # noqa: E402

__version__ = "0.1.0"
__all__ = ["Experiment", "ModelWithData", "PlanSpec", "RunFailed", "Session", "audit_model", "load_run", "plan", "plan_many", "run",
           "run_many", "run_script", "tune_buckets"]


def __getattr__(name):
    if name == "Session":   # warm ranks (launch/session.py), loaded on use
        from .launch.session import Session

        return Session
    raise AttributeError(f"module 'ddplab' has no attribute {name!r}")


def audit_model(model, world_size: int = 4, **kwargs):
    """Audit DDP on your own model factory in one launch; see `ddplab.tools.audit_model`."""
    from .tools import audit_model as _audit

    return _audit(model, world_size, **kwargs)


def tune_buckets(model, world_size: int = 4, **kwargs):
    """Recommend a DDP bucket cap for your own model, measured; see `ddplab.tools.tune_buckets`."""
    from .tools import tune_buckets as _tune

    return _tune(model, world_size, **kwargs)


def plan(spec=None, **fields):
    """Plan one step of a model at a cluster's world size, on this machine; see `ddplab.launch.plan.plan_step`."""
    from .launch.plan import plan_step as _plan

    return _plan(spec, **fields)


def plan_many(spec=None, **fields):
    """Plans for several world sizes and strategies; see `ddplab.launch.plan.plan_many`."""
    from .launch.plan import plan_many as _many

    return _many(spec, **fields)


def run(exp, out=None, **kwargs):
    """Run `exp` on real torchrun ranks; see `ddplab.launch.cold.run`."""
    from .launch.cold import run as _run

    return _run(exp, out, **kwargs)


def run_many(exps, out=None, **kwargs):
    """Run several experiments in one torchrun launch; see `ddplab.launch.cold.run_many`."""
    from .launch.cold import run_many as _run_many

    return _run_many(exps, out, **kwargs)


def load_run(path):
    """Reload a finished run directory; see `ddplab.results.load_run`."""
    from .results import load_run as _load_run

    return _load_run(path)


def load_ipython_extension(ip):
    """`%load_ext ddplab`: the `%ddp_start`, `%%ddp` and `%ddp_stop` magics (`ddplab/magic.py`)."""
    from .magic import load

    load(ip)


def run_script(script, *args, world_size: int = 2, timeout_s: float = 300.0):
    """Run your own torchrun script on local ranks, bounded and cleaned up; see `ddplab.launch.script`."""
    from .launch.script import run_script as _run_script

    return _run_script(script, *args, world_size=world_size, timeout_s=timeout_s)
