"""What each table reads, declared on the table's own def and checked before it runs: a run of
another task, a path, or an empty list passed to a table is a ValueError that says so, not an
AttributeError deep inside.

    @reading(runs="train", probes=("memory",))     # a non-empty list of train runs with the memory probe
    def zero_measured(runs, step=1): ...

    @reading_no_run                                # numbers or tables in, no run
    def fit_sweep(table, min_bytes=0): ...

`reading` names each run argument with the task kind it takes (a kind, a tuple of kinds, or None for
any). Before the table runs, every declared argument is a run (or, for a name with the word `runs`, a
non-empty list of runs) of a declared kind with the declared probes; otherwise a ValueError names the
table, the argument, what it got and which recipe makes what it needs. Stand-ins that tests build
(objects with `spec` and `ranks` but no task kind) are checked only as far as they go. A table that
still fails inside on a run it cannot read (a probe it needs but does not declare) says so as a
ValueError naming the table, the run's task and its probes. Every public function of every table
module carries one of the two (tests/views/test_tables.py checks it).
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


def reading(probes: tuple[str, ...] = (), either: tuple[str, ...] = (), mapping: tuple[str, ...] = (), **runs):
    """Declare a table's run arguments (name -> a task kind, a tuple of kinds, or None for any) and check
    them on every call. A name with the word `runs` (`runs`, `weak_runs`,
    `runs_alone`) takes a non-empty list of runs; one in `either`, a run
    or such a list; one in `mapping` also a dict of runs by name (checked by its values)."""
    wants = {name: None if v is None else (v,) if isinstance(v, str) else tuple(v) for name, v in runs.items()}

    def declare(f):
        label = f"tables.{f.__module__.rsplit('.', 1)[-1]}.{f.__name__}"
        signature = inspect.signature(f)
        if unknown := [n for n in [*wants, *either, *mapping] if n not in signature.parameters]:
            raise TypeError(f"{label} declares {', '.join(unknown)}, which it does not take")

        @functools.wraps(f)
        def table(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)   # a wrong call is the caller's TypeError, as it is
            check(label, wants, tuple(probes), tuple(either), tuple(mapping), bound)
            try:
                return f(*bound.args, **bound.kwargs)
            except (AttributeError, TypeError, KeyError, IndexError) as e:
                if said := _cannot_read(label, f, bound):
                    raise ValueError(f"{said} [{type(e).__name__}: {e}]") from e
                raise

        table.__reads__ = wants
        return table
    return declare


def reading_no_run(f):
    """Declare that table `f` takes no run (numbers or other tables in): nothing to check."""
    f.__reads__ = {}
    return f


def _cannot_read(label: str, f, bound: inspect.BoundArguments) -> str | None:
    """What a table that failed inside says of the runs it was given (None if it was given none)."""
    given = [v for v in bound.arguments.values() for v in (v if isinstance(v, (list, tuple)) else [v])]
    runs = [v for v in given if hasattr(v, "spec")]
    if not runs:
        return None
    said = "; ".join(f"{getattr(r.spec, 'name', '?')!r} is a {getattr(getattr(r.spec, 'task', None), 'kind', '?')} "
                     f"run with probes {', '.join(getattr(r.spec, 'probes', ())) or 'none'}" for r in runs[:3])
    need = (f.__doc__ or "").strip().split("\n")[0]
    return (f"{label} failed on what it was given: {said}. It shows: {need} If that is not the run it reads, pass "
            f"the one the recipe of its chapter makes, with the probes it needs; if it is, check the other arguments.")


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
        plural = ("runs" in name.split("_") or name in either) and not (name in either and _is_run(value))
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
