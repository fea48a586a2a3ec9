"""What each table reads, declared beside it and checked before it runs (issue 30: a run of another
task, a path, or an empty list passed to a table used to fail deep inside with an AttributeError).

A table module says which task kind its runs are (`READS = "pipeline"`: every public function's `run`
or `runs` argument); a function that reads something else says so itself:

    @reading(runs="train", probes=("memory",))       # a non-empty list of train runs with the memory probe
    def zero_measured(runs, step=1): ...

`checked(label, f)` wraps a table so that, before it runs, every declared argument is a run (or, for
`...runs`, a non-empty list of runs) of a declared kind with the declared probes; otherwise a
ValueError names the table, the argument, what it got and which recipe makes what it needs. Stand-ins
that tests build (objects with `spec` and `ranks` but no task kind) are checked only as far as they go.
Used by `tables/__init__.py`, which wraps every table it exports.
"""

from __future__ import annotations

import functools
import inspect

# the recipe (or call) that makes a run of each task kind, for the refusal's "how to get one"
MAKES = {
    "train": "ddplab.run(ddplab.Experiment(...)) or a chapter's recipe",
    "allreduce-sweep": "recipes.allreduce_sweep()",
    "bucket-sweep": "recipes.bucket_sweep (notebook 05)",
    "balance-study": "recipes.balance_study (notebook 07)",
    "data-coverage": "recipes.coverage (notebook 08)",
    "resume": "recipes.resume (notebook 08)",
    "fsdp-memory": "recipes.fsdp_configs (notebook 09)",
    "pipeline": "recipes.pipeline (notebook 09)",
    "tensor-parallel": "recipes.tensor_parallel (notebook 09)",
    "compression": "recipes.hook_comparison (notebook 10)",
    "compiled-ddp": "recipes.eager_and_compiled (notebook 11)",
}
DEFAULT_ARGS = ("run", "runs")   # what a module's READS applies to


def reading(probes: tuple[str, ...] = (), either: tuple[str, ...] = (), mapping: tuple[str, ...] = (), **args):
    """Declare a table's run arguments: name -> a task kind, a tuple of kinds, or None (any kind). A
    name ending in `runs` takes a non-empty list of runs; one in `either`, a run or such a list; one
    in `mapping` also a dict of runs by name (checked by its values)."""
    def mark(f):
        f.__reads__ = ({k: _kinds(v) for k, v in args.items()}, tuple(probes), tuple(either), tuple(mapping))
        return f
    return mark


def _kinds(v) -> tuple[str, ...] | None:
    return None if v is None else (v,) if isinstance(v, str) else tuple(v)


def declared(module, f) -> tuple[dict, tuple, tuple, tuple]:
    """The run arguments `f` of `module` reads: its own `@reading`, else the module's READS for its
    `run`/`runs` parameters; ({}, (), (), ()) if it takes no run."""
    if hasattr(f, "__reads__"):
        return f.__reads__
    default = getattr(module, "READS", None)
    if default is False:
        return {}, (), (), ()
    params = inspect.signature(f).parameters
    return {p: _kinds(default) for p in DEFAULT_ARGS if p in params}, (), tuple(getattr(module, "EITHER", ())), ()


def _is_run(x) -> bool:
    return hasattr(x, "spec") or hasattr(x, "ranks")   # a Run, or a test's stand-in for one


def _said(x) -> str:
    text = repr(x)
    return f"{type(x).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


def check(label: str, wants: dict, probes: tuple, either: tuple, mapping: tuple,
          bound: inspect.BoundArguments) -> None:
    """Raise a ValueError for the first declared argument that is not what the table reads. A one-shot
    iterable of runs (a generator) is read into a list, which `bound` then passes on in its place."""
    for name, kinds in wants.items():
        if name not in bound.arguments or bound.arguments[name] is None and \
                bound.signature.parameters[name].default is None:
            continue   # its default
        value = bound.arguments[name]
        plural = (name.endswith("runs") or name in either) and not (name in either and _is_run(value))
        if plural:
            if _is_run(value) and name not in either:
                one = getattr(getattr(value, "spec", None), "name", "?")
                raise ValueError(f"{label}: `{name}` is one run ({one!r}); it takes a list of runs: pass [run]")
            if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
                raise ValueError(f"{label}: `{name}` must be a list of runs (ddplab.run's results, or "
                                 f"ddplab.load_run(path) each), got {_said(value)}")
            if isinstance(value, dict) and name not in mapping:
                raise ValueError(f"{label}: `{name}` is a dict; pass a list of runs (list(d.values()) if it "
                                 f"maps names to runs)")
            items = list(value.values()) if isinstance(value, dict) else list(value)
            if not isinstance(value, (dict, list, tuple)):   # a generator: read once here, passed on as a list
                bound.arguments[name] = items
            if not items:
                raise ValueError(f"{label}: `{name}` is empty: pass the runs it compares")
        else:
            items = [value]
        for run in items:
            if not _is_run(run):
                raise ValueError(f"{label}: `{name}` must be {'a list of runs' if plural else 'a run'} "
                                 f"(ddplab.run's result, or ddplab.load_run(path)), got {_said(run)}")
            spec = getattr(run, "spec", None)
            kind = getattr(getattr(spec, "task", None), "kind", None)
            if kinds is not None and isinstance(kind, str) and kind not in kinds:
                want = " or ".join(kinds)
                raise ValueError(f"{label}: `{name}` got {getattr(spec, 'name', '?')!r}, a {kind} run, and it reads "
                                 f"{want} runs (made by {'; '.join(MAKES.get(k, k) for k in kinds)})")
            have = getattr(spec, "probes", None)
            missing = [p for p in probes if have is not None and p not in have]
            if missing and kind in (None, "train"):
                raise ValueError(f"{label}: run {getattr(spec, 'name', '?')!r} was run without the "
                                 f"probe(s) {', '.join(missing)} it shows: run it with probes={tuple(probes)!r}")


def checked(label: str, module, f):
    """`f`, checked against what it declares before it runs (the same function if it reads no run)."""
    wants, probes, either, mapping = declared(module, f)
    if not wants:
        return f
    signature = inspect.signature(f)

    @functools.wraps(f)
    def call(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)   # a wrong call is the caller's TypeError, as it is
        check(label, wants, probes, either, mapping, bound)
        return f(*bound.args, **bound.kwargs)

    call.__wrapped_table__ = f
    return call
