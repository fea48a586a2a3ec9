"""Compiled DDP on real gloo ranks (notebook 11): the graphs the backend compiled against
DDPOptimizer's own record of its split, on the lab's GPT-2-style network and on transformers' GPT-2; the
readiness probe under compile; the checks failing on a split that differs; refusals before launch. One
shared launch (tests/support), sized small: the notebook runs the full comparison."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from ddplab import recipes, rundir, verify
from ddplab.predict import buckets
from ddplab.spec import CompiledDdp, Experiment
from ddplab.tables import compiled_ddp as compiled
from tests.support import share

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]

MIB = 2 ** 20


def _exps():
    # transformers' GPT-2 goes through the same check in notebook 11 (`tables.compiled_ddp.verify_graphs_match_split`)
    # and torch's third mode, python_reducer, in a block after DDPOptimizer's (notebook 11 does not run it)
    return [recipes.eager_and_compiled(caps_mb=(2.0,), rounds=1, steps=1, name="compiled-lab",
                                       modes=("ddp_optimizer", "python_reducer"))]


share("compiled-ddp", _exps)


@pytest.fixture(scope="module")
def runs(shared_runs):
    return {r.spec.name: r for r in shared_runs["compiled-ddp"]}


@pytest.mark.slow
def test_the_graphs_compiled_are_torchs_recorded_split(runs):
    table = compiled.split(runs["compiled-lab"])
    compiled.verify_graphs_match_split(table)
    assert table.loc["2", "split_buckets"] > 1   # 3.3 MiB of gradients at a 2 MiB cap: split


@pytest.mark.slow
def test_a_split_that_differs_from_what_was_compiled_fails_the_check(runs):
    table = compiled.split(runs["compiled-lab"])
    wrong = table.assign(graphs_recorded=table["graphs_recorded"] + 1)
    with pytest.raises(verify.CheckFailed, match="DDPOptimizer's records"):
        compiled.verify_graphs_match_split(wrong)


@pytest.mark.slow
def test_ddpoptimizers_first_bucket_ignores_an_explicit_cap(runs):
    """At cap 2 MiB DDP's own first bucket is about 2 MiB; DDPOptimizer's closes at about 1 MiB."""
    row = compiled.split(runs["compiled-lab"]).loc["2"]
    assert row["ddp_first_mib"] >= 2 and row["split_first_mib"] < 1.5
    assert any("does not have" in s for s in compiled.split_matches_ddp(compiled.split(runs["compiled-lab"])))


@pytest.mark.slow
def test_every_gradient_is_seen_ready_under_compile(runs):
    compiled.verify_ready_under_compile(runs["compiled-lab"])
    broken = dataclasses.replace(runs["compiled-lab"], ranks=[dataclasses.replace(
        r, result=dataclasses.replace(r.result, arms=[dataclasses.replace(a, ready=a.ready[:-1]) for a in r.result.arms]))
        for r in runs["compiled-lab"].ranks])
    with pytest.raises(verify.CheckFailed):
        compiled.verify_ready_under_compile(broken)


@pytest.mark.slow
def test_compiling_moves_readiness_and_a_run_where_it_did_not_fails_the_check(runs):
    run = runs["compiled-lab"]
    compiled.verify_compile_moves_readiness(run)
    eager = {a.cap_mb: a.ready for a in run.ranks[0].result.arms if not a.compiled}
    same = dataclasses.replace(run, ranks=[dataclasses.replace(r, result=dataclasses.replace(r.result, arms=[
        dataclasses.replace(a, ready=eager[a.cap_mb]) if a.compiled else a for a in r.result.arms])) for r in run.ranks])
    with pytest.raises(verify.CheckFailed, match="ready order"):
        compiled.verify_compile_moves_readiness(same)


@pytest.mark.slow
def test_no_optimizations_check_fails_where_gradients_are_ready_early_and_passes_where_late(runs):
    run = runs["compiled-lab"]
    eager = [a for a in run.ranks[0].result.arms if not a.compiled]
    assert all(compiled.backward_fractions(a)[0] < 0.2 for a in eager)   # eager: its first gradient early

    def relabel(late: bool):
        def arm(a):
            if not (a.compiled and a.mode == "ddp_optimizer"):
                return a
            last = max(e.t_ns for e in a.ready)
            ready = [dataclasses.replace(e, t_ns=last - i) for i, e in enumerate(a.ready)] if late else a.ready
            return dataclasses.replace(a, mode="no_optimization", ready=ready)
        return dataclasses.replace(run, ranks=[dataclasses.replace(r, result=dataclasses.replace(
            r.result, arms=[arm(a) for a in r.result.arms])) for r in run.ranks])

    with pytest.raises(verify.CheckFailed, match="no_optimization"):   # DDPOptimizer's pieces: ready from ~25%
        compiled.verify_no_optimization_waits(relabel(late=False))
    compiled.verify_no_optimization_waits(relabel(late=True))
    with pytest.raises(ValueError, match="no no_optimization arm"):
        compiled.verify_no_optimization_waits(run)
    table = compiled.modes(run).dropna(subset=["first_ready_at"])   # the Python reducer's arm goes unprobed
    assert len(table) and (table["first_all_reduce_at"] >= table["first_ready_at"]).all()   # a bucket launches once ready


@pytest.mark.slow
def test_a_tied_weight_is_left_out_of_each_pieces_burst_and_named(runs):
    run = runs["compiled-lab"]
    table = compiled.bursts(run, cap=2.0)
    split = compiled._arm(run, "compiled", 2.0).split
    assert table.attrs["shared"] and all(len(pieces) > 1 for pieces, _ in table.attrs["shared"].values())
    assert table["parameters"].sum() + len(table.attrs["shared"]) == len({p for b in split for p in b.params})
    text = compiled.burst_reading(table)
    assert f"{table['compiled_spread_ms'].max():.2f} ms" in text and all(p in text for p in table.attrs["shared"])


@pytest.mark.slow
def test_every_blocks_compiles_are_marked_as_progress_despite_dynamos_reset(runs):
    # the task resets Dynamo before each block, which clears its compile callbacks; the marks must come back
    run = runs["compiled-lab"]
    for rank in range(run.spec.world_size):
        starts = [r for r in rundir.read_progress(run.path, rank) if r.get("compiling") is True]
        assert {r["micro"] for r in starts if r["phase"] in ("warm-up", "round")} == {0, 1}, starts


@pytest.mark.slow
def test_the_compiled_arms_train_exactly_like_eager(runs):
    """(torch's other modes are checked the same way in notebook 11, which runs them.)"""
    compiled.verify_same_training(runs["compiled-lab"])


@pytest.mark.slow
def test_python_reducer_runs_under_compiled_autograd_without_ddps_buckets(runs):
    """optimize_ddp="python_reducer": DDP's C++ Reducer is bypassed (no bucket reaches the comm hook), compiled
    autograd compiles the backward with the reducer's all-reduces, and training matches eager exactly."""
    table = compiled.modes(runs["compiled-lab"])
    row = table.loc["compiled:2/python_reducer"]
    assert row["ddp_buckets_seen"] == 0 and row["gradients_seen_ready"] == 0 and row["graphs_compiled"] >= 2
    assert table.loc["compiled:2", "ddp_buckets_seen"] >= 2   # the block before it, DDP's Reducer at work
    assert row["param_gap_to_eager"] == 0   # aot_eager on 2 ranks: bit for bit


def test_the_sentence_says_whether_the_split_has_ddps_buckets():
    table = pd.DataFrame([{"cap_mb": "default", "split_buckets": 2, "ddp_buckets": 2, "split_first_mib": 1.0,
                           "ddp_first_mib": 1.0, "params_in_same_bucket": "52 of 52"},
                          {"cap_mb": "2", "split_buckets": 3, "ddp_buckets": 2, "split_first_mib": 1.1,
                           "ddp_first_mib": 2.0, "params_in_same_bucket": "32 of 52"}]).set_index("cap_mb")
    said = compiled.split_matches_ddp(table)
    assert "the split has DDP's buckets" in said[0] and "does not have" in said[1]


def test_the_self_tests_answer_is_what_torchs_ddpoptimizer_does():
    """Self-test 11.1 against torch's own DDPOptimizer, on an FX graph of eight 0.5 MiB weights at a 2 MiB cap
    (the lab's rule, `ddp_plan` with a 1 MiB first bucket, gives the same three)."""
    import torch.fx
    import torch.nn as nn
    from torch._dynamo.backends.distributed import DDPOptimizer

    net = nn.Sequential(*[nn.Linear(256, 512, bias=False) if i % 2 == 0 else nn.Linear(512, 256, bias=False)
                          for i in range(8)])   # 131072 floats each: 0.5 MiB
    optimizer = DDPOptimizer(bucket_bytes_cap=2 * MIB, backend_compile_fn=lambda gm, inputs: gm.forward)
    try:   # torch stashes its buckets, then splits the graph, which needs Dynamo's metadata a plain trace lacks
        optimizer.compile_fn(torch.fx.symbolic_trace(net), [])
    except AttributeError:
        pass
    grads = [buckets.Grad(f"g{i}", MIB // 2, float(i)) for i in range(8)]
    assert len(optimizer.buckets) == len(buckets.ddp_plan(grads, 2 * MIB, MIB)) == 3
    assert len(buckets.ddp_plan(grads, 2 * MIB, 2 * MIB)) == 2   # DDP's own, its first bucket at the cap


def test_chapter_11s_modes_are_the_running_torchs():
    """Chapter 11's words on `optimize_ddp`, read from the running torch: its default is `True`, which means
    "ddp_optimizer" (`False`: "no_optimization"), and the config takes four modes, the chapter names each."""
    import typing

    import torch._dynamo.config as config
    from torch._dynamo import utils

    assert config._config["optimize_ddp"].default is True   # the default, whatever a test patched it to
    modes = {"ddp_optimizer", "python_reducer", "python_reducer_without_compiled_forward", "no_optimization"}
    assert set(utils._ddp_optimization_mode) == modes
    literal = [a for a in typing.get_args(config.__annotations__["optimize_ddp"]) if typing.get_origin(a) is typing.Literal]
    assert set(typing.get_args(literal[0])) == modes
    with config.patch(optimize_ddp=True):
        assert utils.get_optimize_ddp_mode() == "ddp_optimizer"
    with config.patch(optimize_ddp=False):
        assert utils.get_optimize_ddp_mode() == "no_optimization"
    text = (ROOT / "notebooks" / "11_compiled_ddp.ipynb").read_text()
    assert all(f"`{m}`" in text or f'`\\"{m}\\"`' in text for m in modes), "chapter 11 names every mode"
    assert "optimize_ddp = True`" in text and "takes four modes" in text, "chapter 11 states the default and the count"


@pytest.mark.parametrize("fields,named", [(dict(caps_mb=(0.5,)), "task.caps_mb"), (dict(caps_mb=(1.0, 1.0)), "task.caps_mb"),
                                          (dict(backend="tvm"), "task.backend"), (dict(warmup_steps=1), "task.warmup_steps"),
                                          (dict(modes=("fast",)), "task.modes")])
def test_a_bad_setting_is_refused_before_launch(fields, named):
    with pytest.raises(ValueError, match=named.replace(".", r"\.")):
        Experiment(world_size=2, task=CompiledDdp(**fields))


def test_one_rank_is_refused():
    with pytest.raises(ValueError, match="world_size"):
        Experiment(world_size=1, task=CompiledDdp())


# ---- --compile in the practitioner tools (tools/compiled.py) --------------------------------------------------


@pytest.mark.slow
def test_the_tools_compiled_report_says_when_the_graphs_are_not_torchs_split(runs):
    from ddplab.tools.compiled import CompiledReport

    report = CompiledReport.of(runs["compiled-lab"], 52)
    assert report.split_is_torchs and "exactly the pieces of torch's recorded split" in report.text()
    wrong = dataclasses.replace(report, split=report.split.assign(graphs_recorded=report.split["graphs_recorded"] + 1))
    assert not wrong.split_is_torchs and "ARE NOT THE PIECES OF TORCH'S RECORDED SPLIT" in wrong.text()
    assert not wrong.to_dict()["split_is_torchs"]
    apart = dataclasses.replace(report, largest_param_gap=0.5)
    assert "DIFFERENT PARAMETERS" in apart.text() and not apart.to_dict()["same_training"]


def test_the_tools_compile_settings_are_checked_before_launch():
    from ddplab.tools.compiled import compilable_caps, compile_settings, compiled_experiment

    with pytest.raises(ValueError, match="^compile_backend: one of aot_eager, inductor, eager"):
        compile_settings("tvm", "ddp_optimizer")
    with pytest.raises(ValueError, match="^compile_mode: torch._dynamo.config.optimize_ddp"):
        compile_settings("aot_eager", "fast")
    assert compilable_caps([None, 0.25, 1.0, 4.0, 1.0]) == (None, 1.0, 4.0)
    base = Experiment(model="ddplab.examples.gpt2_style:gpt2", world_size=2, probes=("memory",), steps=3, d_model=32)
    exp = compiled_experiment(base, (None, 2.0), "aot_eager", "no_optimization")
    assert exp.task.caps_mb == (None, 2.0) and exp.task.modes == ("no_optimization",) and exp.d_model == 32
    assert not exp.ignored_fields()   # the tool's probes and steps stay with the tool's own experiments


_ISOLATION = r"""
import os, sys, tempfile
import torch, torch.distributed as dist, torch.nn as nn
import torch._dynamo.trace_rules as rules, torch._inductor.config as inductor
from ddplab.rank.tasks.compiled_ddp import python_reducer_undone
dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
def state():
    return (inductor._fuse_ddp_communication, inductor._fuse_ddp_bucket_size,
            "torch.nn.parallel.distributed" in rules.LEGACY_MOD_INLINELIST,
            any(p.endswith("nn/parallel/distributed") for p in rules.get_legacy_mod_inlinelist()))
def build():
    with torch._dynamo.config.patch(optimize_ddp="python_reducer"):
        nn.parallel.DistributedDataParallel(nn.Linear(4, 4), bucket_cap_mb=7)
before = state()
with python_reducer_undone():
    build()
    inside = state()
after = state()
build()   # the same without the guard: torch leaves its changes behind
print(repr([before, inside, after, state()]))
dist.destroy_process_group()
"""


def test_building_ddp_under_python_reducer_leaves_nothing_behind_for_the_next_block():
    """torch 2.13's DDP constructor, under optimize_ddp="python_reducer", turns on Inductor's DDP fusion and
    adds DDP to Dynamo's inline list for the whole process; the rank task undoes both after the block (in a
    subprocess: a process group of its own)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _ISOLATION], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    import ast

    before, inside, after, unguarded = ast.literal_eval(out.stdout.strip().splitlines()[-1])
    assert before == after == (False, 25, False, False) and inside == (True, 7, True, True)
    assert unguarded == (True, 7, True, True)   # what the guard is for


def test_same_training_is_bit_for_bit_under_aot_eager_and_within_rel_under_inductor():
    """aot_eager runs the eager kernels, so on 2 ranks any gap at all fails; Inductor may reassociate sums, and
    a ring of 4 adds in its buckets' order, so 1e-6 passes there."""
    from types import SimpleNamespace as NS

    def fake(backend, gap, ranks=2):
        arms = [NS(compiled=False, param_gap=0.0), NS(compiled=True, param_gap=gap, mode="ddp_optimizer")]
        return NS(spec=NS(name="fake", task=NS(kind="compiled-ddp", backend=backend), probes=()), world_size=ranks,
                  ranks=[NS(rank=r, result=NS(arms=arms)) for r in range(ranks)])
    compiled.verify_same_training(fake("aot_eager", 0.0))
    with pytest.raises(verify.CheckFailed, match="bit for bit"):
        compiled.verify_same_training(fake("aot_eager", 1e-7))
    compiled.verify_same_training(fake("inductor", 1e-6))
    compiled.verify_same_training(fake("aot_eager", 1e-6, ranks=4))
    with pytest.raises(verify.CheckFailed):
        compiled.verify_same_training(fake("inductor", 1e-3))
