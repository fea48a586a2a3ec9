"""The results API on a run it is not for, a path that is no path, and a rank file whose
loss contradicts its own sum are ValueErrors that say so (each was a KeyError, an AttributeError, a
TypeError, or accepted, before). The tables' cases use stand-ins (objects with `spec` and `ranks`, as
`tables/reads.py` allows); the damaged rank file is a copy of a real run's."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from types import SimpleNamespace as NS

import pytest

import ddplab
from ddplab import recipes, tables
from ddplab.failures import RunFailed
from ddplab.results import RankResult, Run


def _sweep_run(sizes=(4096, 8192)) -> Run:
    """An all-reduce sweep's run, as its ranks record it: sizes with their times, no training steps."""
    result = NS(sizes=[NS(bytes=n, ms=[1.0, 1.1, 0.9], write_bytes=[n] * 3) for n in sizes])
    spec = recipes.allreduce_sweep(2, max_bytes=max(sizes), repeats=3)
    return Run(Path("runs/sweep"), spec, [RankResult(NS(rank=r), result) for r in range(2)])


@pytest.mark.parametrize("method", ["global_loss", "step_ms"])
def test_a_sweep_run_asked_for_its_training_steps_says_it_has_none(method):
    with pytest.raises(ValueError, match=rf"^Run\.{method}: 'allreduce-sweep-w2' is a allreduce-sweep run, whose "
                                         rf"ranks record no training steps with .*; the tables of its chapter read it"):
        getattr(_sweep_run(), method)()


@pytest.mark.parametrize("path", [None, 3, b"runs/x", ""])
def test_load_run_of_something_that_is_not_a_path_names_path(path):
    with pytest.raises(ValueError, match=r"^path: a run directory \(a str or a Path"):
        ddplab.load_run(path)


def test_the_startup_claim_on_a_sweep_without_its_sizes_names_the_size_it_lacks():
    run = _sweep_run((4096, 8192))
    with pytest.raises(ValueError, match=r"^allreduce_run: the claim compares 65536 B \(k=16 x the smallest "
                                         r"message\) with 4096 B, and this sweep measured no 65536 B; its sizes: "
                                         r"4096 B, 8192 B"):
        tables.buckets.judge_startup_term(run)
    assert tables.buckets.judge_startup_term(run, k=2).claim   # a size it measured: judged


def test_the_bandwidth_claim_below_the_smallest_message_names_n_bytes():
    with pytest.raises(ValueError, match=r"^n_bytes: 1000 is below the sweep's smallest message \(4096 B\)"):
        tables.buckets.judge_bandwidth_term(_sweep_run(), 1000)


def _compiled_run(arms) -> Run:
    """A compiled-ddp run's stand-in holding only `arms` (name, mode, compiled)."""
    made = [NS(name=n, mode=m, compiled=c, cap_mb=None, ready=[], backward_start_ns=0, split=[], ddp_buckets=[],
               graphs_compiled=1, recorded_graphs=1) for n, m, c in arms]
    result = NS(arms=made, parameter_bytes={})
    spec = recipes.compiled_ddp.eager_and_compiled(2).replace(name="modes")
    return Run(Path("runs/modes"), spec, [RankResult(NS(rank=0), result)])


MODES_ONLY = [("eager:1/no_optimization", "no_optimization", False),
              ("compiled:1/no_optimization", "no_optimization", True)]


@pytest.mark.parametrize("table", ["ready_order", "bursts"])
def test_a_compiled_table_at_a_cap_the_run_lacks_names_cap_and_the_arms_it_has(table):
    with pytest.raises(ValueError, match=r"^cap: 'modes' has no (eager|compiled) arm at cap default in torch's "
                                         r"default mode \(ddp_optimizer\); its arms: eager:1/no_optimization, "
                                         r"compiled:1/no_optimization"):
        getattr(tables.compiled_ddp, table)(_compiled_run(MODES_ONLY))


def test_the_split_of_a_run_without_ddp_optimizer_says_which_arms_it_has():
    with pytest.raises(ValueError, match=r"^run: 'modes' has no compiled arm in torch's default mode "
                                         r"\(ddp_optimizer\), whose split this table shows; its arms: "):
        tables.compiled_ddp.split(_compiled_run(MODES_ONLY))
    ok = _compiled_run([("eager:default", "ddp_optimizer", False), ("compiled:default", "ddp_optimizer", True)])
    assert list(tables.compiled_ddp.split(ok).index) == ["default"]


@pytest.mark.slow
@pytest.mark.parametrize("loss, loss_sum, accepted", [
    (float("nan"), None, False),          # the loss NaN, its sum as the rank wrote it
    (float("inf"), None, False),
    (None, float("nan"), False),          # the sum NaN, the loss finite
    (float("nan"), float("nan"), True),   # both: what a diverged run writes, and diverged() says where
])
def test_a_rank_file_whose_loss_is_not_its_own_sum_over_tokens_is_refused(run2, tmp_path, loss, loss_sum, accepted):
    copy = Path(shutil.copytree(run2.path, tmp_path / "copy"))
    f = copy / "rank1.json"
    d = json.loads(f.read_text())
    step = d["result"]["steps"][1]
    step.update({k: v for k, v in (("loss", loss), ("loss_sum", loss_sum)) if v is not None})
    f.write_text(json.dumps(d))
    if accepted:
        run = ddplab.load_run(copy)
        assert math.isnan(run.ranks[1].steps[1].loss) and "step 1 on rank(s) 1" in run.diverged()
        return
    with pytest.raises(RunFailed, match=r"Rank 1's result file says step 1's loss is (nan|inf|[0-9.]+), and its "
                                        r"loss_sum / tokens is .*: the rank wrote both from one sum"):
        ddplab.load_run(copy)
