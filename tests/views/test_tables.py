"""Pure table arithmetic on stand-in runs (no ranks launched)."""

from types import SimpleNamespace

import pytest

from ddplab import Experiment, tables


def fake_run(world_size, local_batch, step_ms, losses=None):
    spec = Experiment(world_size=world_size, local_batch=local_batch, steps=len(step_ms))
    losses = losses or [1.0] * len(step_ms)
    return SimpleNamespace(spec=spec, world_size=world_size, step_ms=lambda warmup=0: step_ms[warmup:],
                           global_loss=lambda: losses)


def test_strong_scaling_efficiency_is_t1_over_w_times_tw():
    runs = [fake_run(1, 32, [0, 0, 100, 100]), fake_run(2, 16, [0, 0, 60, 60]), fake_run(4, 8, [0, 0, 50, 50])]
    df = tables.global_batch.scaling(runs, "strong")
    assert list(df["efficiency"]) == [1.0, pytest.approx(100 / 120, abs=1e-3), 0.5]
    assert list(df["examples_per_s"]) == [320.0, pytest.approx(533.333, abs=1e-3), 640.0]


def test_weak_scaling_efficiency_is_t1_over_tw():
    runs = [fake_run(1, 8, [0, 0, 40]), fake_run(4, 8, [0, 0, 80])]
    df = tables.global_batch.scaling(runs, "weak")
    assert list(df["efficiency"]) == [1.0, 0.5] and list(df["speedup"]) == [1.0, 2.0]


def test_loss_by_examples_bins_steps_by_examples_seen():
    run = fake_run(2, 4, [1] * 6, losses=[6, 4, 3, 3, 2, 2])  # global batch 8
    curve = tables.global_batch.loss_by_examples(run, bin_examples=16)
    assert list(curve.index) == [16, 32, 48] and list(curve) == [5, 3, 2]
    with pytest.raises(ValueError, match="multiple of the global batch"):
        tables.global_batch.loss_by_examples(run, bin_examples=12)


def test_scaling_kind_is_checked():
    from types import SimpleNamespace as NS

    with pytest.raises(ValueError, match="strong"):
        tables.global_batch.scaling([NS(spec=Experiment())], "medium")
    with pytest.raises(ValueError, match="tables.global_batch.scaling: `runs` is empty"):
        tables.global_batch.scaling([], "strong")


def test_examples_per_step_counts_what_the_ranks_consumed_not_what_was_asked():
    from types import SimpleNamespace as NS

    from ddplab.tables.global_batch import examples_per_step

    step = lambda ids: NS(sample_ids=ids)
    run = NS(spec=NS(steps=2), ranks=[NS(steps=[step([0, 1]), step([4, 5])]),
                                      NS(steps=[step([2, 3]), step([4, 5])])])   # step 1: both ranks took 4, 5
    table = examples_per_step(run)
    assert table["consumed"].tolist() == [4, 4] and table["distinct"].tolist() == [4, 2]


def test_off_line_tells_a_weight_bias_swap_from_a_real_reordering():
    import pandas as pd

    from ddplab.tables.readiness import off_line

    # source order a.weight, a.bias, b.weight, b.bias; reverse source positions 3, 2, 1, 0
    order = pd.DataFrame({"reverse_source_position": [3, 2, 1, 0], "ready_position": [2, 3, 0, 1]},
                         index=["a.weight", "a.bias", "b.weight", "b.bias"])
    order["as_assumed"] = order["ready_position"] == order["reverse_source_position"]
    assert off_line(order)["swapped_within_module"].tolist() == [True, True, True, True]
    order["ready_position"] = [0, 3, 2, 1]   # a.weight ready first: not a swap with its bias
    order["as_assumed"] = order["ready_position"] == order["reverse_source_position"]
    assert not off_line(order).loc["a.weight", "swapped_within_module"]


def test_a_run_whose_loss_stopped_being_finite_says_where_it_diverged():
    """A run with lr far too high ended with NaN losses and was reported as a success."""
    from pathlib import Path
    from types import SimpleNamespace as NS

    from ddplab.results import Run

    def run(*losses):
        return Run(Path("x"), Experiment(lr=1000.0), [NS(rank=r, steps=[NS(step=i, loss=l[r]) for i, l in enumerate(losses)])
                                                      for r in range(2)])
    assert run((1.0, 1.0), (2.0, 2.0)).diverged() is None
    said = run((1.0, 1.0), (1.0, float("inf")), (float("nan"), float("nan"))).diverged()
    assert said == "the loss became inf at step 1 on rank(s) 1: training diverged (lr=1000; try a smaller one)"


def test_a_declared_table_takes_a_generator_once_and_refuses_a_dict_a_path_and_another_tasks_run():
    """tables/reads.py: what a table declares is checked before it runs, and a one-shot iterable of runs
    reaches the table as the list the check read (not an exhausted generator)."""
    from types import SimpleNamespace as NS

    from ddplab.spec.allreduce_sweep import AllReduceSweep
    from ddplab.tables.reads import reading

    @reading(runs="train")
    def names(runs):
        return [r.spec.name for r in runs]
    table = names
    run = NS(spec=Experiment(name="a"), ranks=[])
    assert table(r for r in [run]) == ["a"]
    with pytest.raises(ValueError, match=r"tables\.test_tables\.names: `runs` is a dict; pass a list of runs"):
        table({"a": run})
    with pytest.raises(ValueError, match=r"`runs` must be a list of runs .*got str 'runs/a'"):
        table("runs/a")
    with pytest.raises(ValueError, match=r"`runs` got 'sweep', a allreduce-sweep run, and it reads train runs"):
        table([NS(spec=Experiment(name="sweep", task=AllReduceSweep(sweep_bytes=(4096,))), ranks=[])])


def _table_functions():
    """(module, name, function) for every public function defined in every tables module."""
    import importlib
    import inspect
    import pkgutil

    import ddplab.tables
    for info in pkgutil.iter_modules(ddplab.tables.__path__):
        module = importlib.import_module(f"ddplab.tables.{info.name}")
        for name, f in vars(module).items():
            if inspect.isfunction(f) and f.__module__ == module.__name__ and not name.startswith("_"):
                yield module, name, f


def test_every_table_declares_the_runs_it_reads_on_its_def():
    """A table cannot skip its checks: every public function of every tables module carries `@reading(...)`
    or `@reading_no_run` in its own source, and one that takes a parameter named like a run declares it."""
    import inspect
    import re

    looks_like_a_run = re.compile(r"^(runs?|\w+_runs?|runs?_\w+)$")
    undeclared, unchecked = [], []
    for module, name, f in _table_functions():
        if module.__name__.endswith(".reads"):
            continue
        source = inspect.getsource(f)   # the decorator is part of the def's source: read, not called
        declaration = re.match(r"\s*@(reading\(.*?\)|reading_no_run)\s*\n", source, re.S)
        if not declaration or not hasattr(f, "__reads__"):
            undeclared.append(f"{module.__name__}.{name}")
            continue
        runs = [p for p in inspect.signature(f).parameters if looks_like_a_run.match(p)]
        if missing := [p for p in runs if p not in f.__reads__]:
            unchecked.append(f"{module.__name__}.{name} ({', '.join(missing)})")
    assert undeclared == [] and unchecked == []


def test_a_table_that_fails_inside_on_a_run_names_itself_the_task_and_the_probes():
    """The last resort behind the declared checks: a table that still fails inside on a run it was given
    says so as a ValueError naming the table, the run's task and its probes, not the raw error."""
    from types import SimpleNamespace as NS

    from ddplab.tables.reads import reading

    @reading(run="train")
    def first_step(run):
        """The first step of each rank."""
        return [r.steps[0] for r in run.ranks]

    run = NS(spec=Experiment(name="empty", probes=("memory",)), ranks=[NS(steps=[])])
    with pytest.raises(ValueError, match=r"^tables\.test_tables\.first_step failed on what it was given: 'empty' is a train run "
                                         r"with probes memory\. It shows: The first step of each rank\. .*"
                                         r"\[IndexError: list index out of range\]"):
        first_step(run)

    @reading(run="train")
    def first_of(values, run=None):
        return values[0]
    with pytest.raises(IndexError):   # no run among its arguments: the error is the caller's, as it is
        first_of([])
