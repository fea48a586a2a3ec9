"""DDP's communication hooks on real gloo ranks (notebook 10): every rank's bytes against the
payload rule on 2 and 4 ranks, a wrong rule failing the check, the learning gap, what torch refused,
and PowerSGD on a model whose every tensor it compresses (pytorch#58467 on gloo: fixed in 2.13). One
shared launch (tests/support), sized small: the notebook runs the full comparison."""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.distributed as dist

from ddplab import recipes, verify
from ddplab.predict import comm, compression
from ddplab.tables import compression as hooks
from tests.support import share

SMALL = dict(learn_steps=4, rounds=1, steps=2)


def _exps():
    return [recipes.hook_comparison(**SMALL),
            recipes.hook_comparison(world_size=4, local=False, learn_steps=3, rounds=1, steps=1),
            recipes.hook_comparison(model="ddplab.examples.matrices:matrices_only", hooks=("allreduce", "powersgd"),
                               name="compression-matrices", learn_steps=4, rounds=1, steps=1),
            recipes.hook_comparison(model="tests.support.gradient_models:frozen_matrix", hooks=("allreduce", "fp16", "powersgd"),
                               name="compression-frozen", local=False, learn_steps=3, rounds=1, steps=1),
            recipes.allreduce_sweep(2, min_bytes=4096, max_bytes=4096, repeats=2, extra_bytes=FRAMING_SIZES,
                                    name="gloo-framing")]


FRAMING_SIZES = (64, 4 * 2 ** 20, 6 * 2 ** 20, 15 * 2 ** 20)   # one header's count, and where gloo adds pieces


share("compression", _exps)
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(shared_runs):
    return {r.spec.name: r for r in shared_runs["compression"]}


@pytest.mark.parametrize("name", ["compression-w2", "compression-w4", "compression-matrices", "compression-frozen"])
def test_every_rank_writes_the_payload_rules_bytes_in_every_step(runs, name):
    table = hooks.bytes_table(runs[name])
    hooks.verify_bytes(table)
    assert table["worst_rel_error"].max() < 0.02
    assert set(table.index.get_level_values("hook")) == set(runs[name].spec.task.hooks)


def _ignores_start(hook, shapes, w, framing, step, psgd):
    return compression.written_bytes(hook, shapes, w, framing, step + psgd.start_iter, psgd)


def _fp16_at_four_bytes(hook, shapes, w, framing, step, psgd):
    return compression.written_bytes("allreduce" if hook == "fp16" else hook, shapes, w, framing, step, psgd)


def _forgets_q(hook, shapes, w, framing, step, psgd):
    """PowerSGD sending only its P factors (the uncompressed tensors and P, no Q)."""
    calls = compression.hook_calls(hook, shapes, step, psgd)
    if hook == "powersgd" and len(calls) == 3:
        return sum(calls[:2]) * 2 * (w - 1) / w + framing(calls[0]) + framing(calls[1])
    return compression.written_bytes(hook, shapes, w, framing, step, psgd)


def _no_framing(hook, shapes, w, framing, step, psgd):
    return compression.written_bytes(hook, shapes, w, 0, step, psgd)


def _counts_the_frozen_matrix(hook, shapes, w, framing, step, psgd):
    """The rule on every parameter's shape, the frozen matrix's too (what the table did before)."""
    return compression.written_bytes(hook, [*shapes, [128, 128]], w, framing, step, psgd)


@pytest.mark.parametrize("rule,name", [(_ignores_start, "compression-w2"), (_fp16_at_four_bytes, "compression-w2"),
                                       (_forgets_q, "compression-w2"), (_no_framing, "compression-w4"),
                                       (_counts_the_frozen_matrix, "compression-frozen")])
def test_a_wrong_payload_rule_fails_the_check(runs, rule, name):
    with pytest.raises(verify.CheckFailed, match="payload rule"):
        hooks.verify_bytes(hooks.bytes_table(runs[name], rule=rule))


def test_all_matrices_compressed_leaves_an_empty_all_reduce_that_gloo_now_runs(runs):
    table = hooks.bytes_table(runs["compression-matrices"])
    calls = compression.hook_calls("powersgd", runs["compression-matrices"].ranks[0].result.parameter_shapes, 10,
                                   compression.PowerSGD())
    row = table.loc[("powersgd", "every step")]
    assert calls[0] == 0 and row["calls"] == 3
    assert row["written_min"] == row["written_max"] == row["predicted_written"]   # the empty call writes nothing


def test_every_hook_gets_one_bucket_and_bf16_is_refused_by_name_on_cpu(runs):
    run = runs["compression-w2"]
    assert {a.buckets for a in run.ranks[0].result.arms} == {1}
    built_for_nccl = torch.version.cuda is not None and dist.is_nccl_available()
    assert ("bf16" in run.ranks[0].result.refused) != built_for_nccl
    if not built_for_nccl:
        assert "NCCL" in run.ranks[0].result.refused["bf16"]


def test_learning_errors_follow_the_formats_element_by_element(runs):
    for name in ("compression-w2", "compression-w4"):
        run = runs[name]
        learned, w = hooks.learning(run), run.world_size
        assert learned.loc["allreduce", "step_error"] == 0 and learned.loc["allreduce", "param_gap"] == 0
        assert learned.loc["allreduce", "summed_error"] == 0 and learned.loc["allreduce", "worst_element"] == 0
        for hook in ("fp16", "bf16"):   # every element within the cast-and-sum bound, and near it (not loose)
            bound = compression.rounding_bound(hook, w)
            assert 0.3 * bound < learned.loc[hook, "worst_element"] <= bound, (name, hook)
        assert learned.loc["fp16", "worst_element"] < compression.rounding_bound("bf16", w) / 4
        assert learned.loc["powersgd", "step_error"] > 10 * learned.loc["bf16", "step_error"]
        assert learned.loc["noop", "step_error"] > 0.1   # the local gradient is not the average


def test_summed_errors_grow_with_the_steps_and_the_reading_says_what_the_run_shows(runs):
    run = runs["compression-w2"]
    summed, learned = hooks.summed_errors(run), hooks.learning(run)
    start = run.spec.task.start_powerSGD_iter
    assert summed["powersgd"][:start] == [0.0] * start   # the plain all-reduce before PowerSGD starts
    assert summed["powersgd"][-1] == learned.loc["powersgd", "summed_error"] > 0
    text = hooks.powersgd_reading(run)
    assert f"{learned.loc['powersgd', 'loss_gap']:+.3g}" in text and f"{learned.loc['powersgd', 'summed_error']:.0%}" in text
    grew = summed["powersgd"][-1] > summed["powersgd"][start]
    assert ("and growing" in text) == grew and ("falling" in text) != grew
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState

    default = inspect.signature(PowerSGDState).parameters["start_powerSGD_iter"].default
    assert f"({default} by default)" in text   # the running torch's, not a remembered one


def test_the_timing_table_reads_the_run_and_needs_the_local_arms(runs):
    run = runs["compression-w2"]
    table = hooks.timing(run)
    assert list(table.index) == list(run.spec.task.hooks) and table.loc["allreduce", "compress_ms"] == 0
    local = hooks.paired_ms(run, "fp16", "local")
    assert table.loc["fp16", "local_ms"] == pytest.approx(sorted(local)[len(local) // 2] if len(local) % 2 else
                                                          sum(sorted(local)[len(local) // 2 - 1:][:2]) / 2)
    with pytest.raises(ValueError, match="task.local"):
        hooks.timing(runs["compression-w4"])


def test_a_narrower_jobs_own_groups_leave_the_next_jobs_groups_meeting(tmp_path):
    # a 2-rank comparison with its one-rank groups in a 4-rank session, then a 4-rank job. Were the
    # one-rank groups made by ranks 0-1 alone, those two would have made two groups more than ranks 2-3,
    # torch would name the next job's groups differently on the two pairs, and they would wait in the
    # store until timeout_s: the worker makes every task's groups on every rank instead
    import ddplab
    from ddplab import Experiment

    with ddplab.Session(world_size=4, runs_dir=tmp_path / "runs") as s:
        small = ddplab.run(recipes.hook_comparison(hooks=("allreduce",), learn_steps=1, rounds=1, steps=1, pin_cpus=False),
                           tmp_path / "narrow", progress=False)
        after = ddplab.run(Experiment(name="after", world_size=4, steps=1, local_batch=4, seq_len=8, timeout_s=30),
                           tmp_path / "after", progress=False)
        assert s.jobs == 2 and s.alive()
    assert [a.group for a in small.ranks[0].result.arms] == ["world", "local"]
    assert len(after.ranks) == 4


def test_a_frozen_matrix_is_in_no_bucket_and_in_no_payload(runs):
    run = runs["compression-frozen"]
    result = run.ranks[0].result
    assert result.parameter_names == ["emb.weight", "mix.weight", "head.weight", "head.bias"]
    assert result.requires_grad == [True, False, True, True]
    payload = compression.payload_bytes("allreduce", hooks.bucket_shapes(run))
    carried = {a.bucket_bytes for r in run.ranks for a in r.result.arms}   # what DDP handed every hook, every rank
    assert carried == {payload}
    assert compression.payload_bytes("allreduce", result.parameter_shapes) - payload == 4 * 128 * 128
    table = hooks.bytes_table(run)
    assert table.loc[("allreduce", "every step"), "payload_bytes"] == payload
    assert (table["worst_rel_error"] == 0).all(), table   # exact: the payload, and gloo's framing at each size


def test_gloos_framing_is_measured_at_every_size_a_hook_sends(runs):
    for name in ("compression-w2", "compression-frozen"):
        run, psgd = runs[name], hooks._psgd(runs[name])
        measured = set(hooks.framing(run).index)
        sent = {c for h in run.spec.task.hooks for step in (0, psgd.start_iter)
                for c in compression.hook_calls(h, hooks.bucket_shapes(run), step, psgd) if c}
        assert sent <= measured, sent - measured
        frame = hooks.framing_at(run)
        assert all(frame(n) == hooks.framing(run).loc[n, "written"] - hooks.framing(run).loc[n, "ring_share"]
                   for n in sent)


def test_gloos_framing_grows_by_its_pieces_as_the_rule_says(runs):
    run = runs["gloo-framing"]
    for per_rank in zip(*[r.result.sizes for r in run.ranks]):
        n = per_rank[0].bytes
        framing = {b - comm.ring_bytes_per_rank(n, 2) for c in per_rank for b in c.write_bytes}
        assert framing == {compression.gloo_framing(n, 2)}, (n, framing)
    assert compression.gloo_framing(15 * 2 ** 20, 2) == 4 * compression.gloo_framing(4 * 2 ** 20, 2)


def test_the_family_claim_keeps_one_key_whichever_hook_is_weakest():
    """`judge_pays` names every hook in its headline and the weakest in a bracket that the claim's key leaves out:
    the same claim, whichever hook came out weakest, has one reference run and one line in this run's tally."""
    from ddplab import claims
    from ddplab.references import claim_key
    from ddplab.tables.compression import family_claim

    hooks, where = ("fp16", "bf16", "powersgd"), "1GbE link"
    keys = {claim_key(family_claim(hooks, where, h)) for h in hooks}
    assert len(keys) == 1
    v = claims.paired(family_claim(hooks, where, "bf16"), [1.0 + i for i in range(12)], [5.0 + i for i in range(12)],
                      below=0)
    assert v.headline == "fp16, bf16, powersgd each shorten the step against float32 (1GbE link)"
    assert "the weakest of 3: bf16" in v.details()


def test_cost_reading_says_noise_exactly_when_the_interval_holds_0(runs):
    from ddplab.signtest import median_interval

    run = runs["compression-w2"]
    text = hooks.cost_reading(run, hooks.timing(run))
    base = hooks.paired_ms(run, "allreduce", "local")
    _, low, high = median_interval([a - b for a, b in zip(hooks.paired_ms(run, "noop", "local"), base)])
    line = next(ln for ln in text.splitlines() if ln.startswith("noop's compress_ms"))
    assert ("noise" in line) == (low <= 0 <= high) and f"[{low:+.2f}, {high:+.2f}] ms" in line
