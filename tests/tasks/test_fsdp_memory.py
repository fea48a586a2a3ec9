"""Notebook 09, FSDP2 memory over one step and ZeRO's stages: the ZeRO paper's figures reproduce; the pure
FSDP2 model's units, padding and timeline; the FsdpMemory spec refuses bad settings before launch; the
tables and checks on hand-made records; and a real 4-rank run where the predicted peak is within 10% of
the measured one for every configuration and rank, while a prediction that ignores the gathered units
fails the same check."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ddplab import verify
from ddplab.predict import fsdp_memory as model
from ddplab.predict import zero
from ddplab.predict.memory import activation_bytes, parameter_numels
from ddplab.recipes.fsdp_memory import fsdp_configs, zero_stages_measured
from ddplab.spec import Experiment, FsdpMemory
from ddplab.record.fsdp_memory import FsdpConfigRecord, FsdpMemoryRecord, FsdpUnit, MemorySample
from ddplab.spec.fsdp_memory import SAMPLE_CATEGORIES
from ddplab.tables import fsdp_memory as views
from ddplab.units import MIB


# ---- ZeRO ----------------------------------------------------------------------------------------------
def test_zero_reproduces_the_papers_7_5b_parameters_on_64_devices():
    table = zero.zero_stages(7.5e9, 64)
    gb = table["total_gb"]
    assert (round(gb[0]), round(gb[1], 1), round(gb[2], 1), round(gb[3], 1)) == (120, 31.4, 16.6, 1.9)
    assert views.zero_stages(7.5e9, 64)["total_gb"].round(1).tolist() == [120.0, 31.4, 16.6, 1.9]


def test_zero_stages_follow_the_papers_formulas():
    psi, n, k = 1000, 8, 12
    totals = [zero.zero_state_bytes(psi, n, s)["total"] for s in range(4)]
    assert totals == [(2 + 2 + k) * psi, (2 + 2) * psi + k * psi / n, 2 * psi + (2 + k) * psi / n,
                      (2 + 2 + k) * psi / n]
    fp32 = zero.zero_state_bytes(psi, n, 0, "fp32")
    assert (fp32["parameters"], fp32["gradients"], fp32["optimizer_state"]) == (4 * psi, 4 * psi, 8 * psi)
    assert zero.zero_stages(psi, 1)["reduction"] == [1.0] * 4   # one device: nothing to shard


@pytest.mark.parametrize("args, field", [((0, 4, 1), "psi"), ((float("inf"), 4, 1), "psi"),
                                         ((float("nan"), 4, 1), "psi"), ((10, 0, 1), "n_devices"),
                                         ((10, 4, 4), "stage"), ((10, 4.0, 1), "n_devices")])
def test_zero_refuses_bad_input_naming_it(args, field):
    with pytest.raises(ValueError, match=field):
        zero.zero_state_bytes(*args)
    with pytest.raises(ValueError, match="precision"):
        zero.zero_stages(10, 4, precision="fp16")


def test_zero1_exact_gives_whole_tensors_by_torchs_rule():
    # largest first to the least loaded rank: 10 -> 0, 6 -> 1, 4 -> 1, then a tie (10, 10): the lowest rank
    assert zero.zero1_exact([10, 6, 4, 4], 2) == [14 * 8 + 2 * 4, 10 * 8 + 2 * 4]
    assert sum(zero.zero1_exact([10, 6, 4, 4], 3)) == 24 * 8 + 4 * 4


@pytest.mark.parametrize("numels, field", [([], "numels"), ([10, -1], "numels"), ([10, 2.5], "numels"),
                                           ([10, True], "numels"), (None, "numels")])
def test_zero1_exact_refuses_bad_tensor_sizes_naming_them(numels, field):
    with pytest.raises((ValueError, TypeError), match=field):
        zero.zero1_exact(numels, 2)
    with pytest.raises(ValueError, match="state_bytes_per_element"):
        zero.zero1_exact([10], 2, state_bytes_per_element=-8)


# ---- the pure FSDP2 model ------------------------------------------------------------------------------
EXP = fsdp_configs()


@pytest.mark.parametrize("exp", [EXP, EXP.replace(model="mlp", n_layers=2)])
def test_units_hold_every_parameter_in_order(exp):
    assert [n for u in model.units(exp) for d0, rest in u.shapes for n in [d0 * rest]] == parameter_numels(exp)
    assert sum(model.unit_activation_bytes(exp)) == activation_bytes(exp)


def test_a_shard_is_padded_to_ceil_rows_and_the_last_rank_owns_fewer():
    unit = model.Unit("tok_emb", ((250, 256),))
    assert model.shard_bytes(unit, 4, 4) == 63 * 256 * 4                 # ceil(250 / 4) rows on every rank
    assert [model.local_numel(unit, 4, r) for r in range(4)] == [63 * 256] * 3 + [61 * 256]
    assert model.local_numel(model.Unit("tiny", ((2, 1),)), 4, 3) == 0     # more ranks than rows: an empty shard


def test_keeping_units_gathered_holds_them_all_at_the_loss():
    full = sum(4 * model.shard_bytes(u, 4, 4) for u in model.units(EXP))
    at_loss = {r: next(m for m in model.timeline(EXP, r) if m["event"] == "loss") for r in (True, False)}
    assert at_loss[False]["bytes"]["gathered_parameters"] == full and at_loss[True]["bytes"]["gathered_parameters"] == 0
    assert model.peak(EXP, False) > model.peak(EXP, True) > sum(model.sharded_state(EXP).values())


def test_explicit_prefetch_adds_the_next_units_buffer_in_forward_only():
    def forward_comm(prefetch):
        return max(m["bytes"]["comm_buffers"] for m in model.timeline(EXP, True, prefetch) if m["event"] == "pre-forward")
    block = 4 * model.shard_bytes(model.units(EXP)[2], 4, 4)
    assert forward_comm(True) - forward_comm(False) == block
    backward = [[m["total"] for m in model.timeline(EXP, True, p) if m["event"] in ("post-backward", "reduce-scatter")]
                for p in (False, True)]
    assert backward[0] == backward[1]


# ---- the spec ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fields, field", [
    (dict(task=FsdpMemory(reshard_after_forward=())), "task.reshard_after_forward"),
    (dict(task=FsdpMemory(reshard_after_forward=(True, True))), "task.reshard_after_forward"),
    (dict(task=FsdpMemory(prefetch=(1,))), "task.prefetch"),
    (dict(task=FsdpMemory(prefetch="yes")), "task.prefetch"),
    (dict(task=FsdpMemory(warmup_steps=0)), "task.warmup_steps"),
    (dict(task=FsdpMemory(warmup_steps=11)), "task.warmup_steps"),
    (dict(model="branchy"), "model"),
    (dict(tie_weights=True), "tie_weights"),
    (dict(checkpointing=True), "checkpointing"),
    (dict(world_size=1, local_batch=2), "world_size"),
])
def test_bad_fsdp_memory_settings_are_refused_naming_the_field(fields, field):
    base = dict(world_size=4, task=FsdpMemory())
    base.update(fields)
    with pytest.raises(ValueError, match=f"Experiment.{field}:"):
        Experiment(**base)


def test_a_field_the_fsdp_memory_task_does_not_read_is_refused():
    with pytest.raises(ValueError, match="Experiment.sharding: the fsdp-memory task does not read it"):
        Experiment(world_size=4, sharding="fsdp2", task=FsdpMemory())


def test_fsdp_memory_spec_round_trips_and_runs_every_combination():
    exp = Experiment(world_size=4, task=FsdpMemory(reshard_after_forward=True, prefetch=(False, True)))
    again = Experiment.from_json(exp.to_json())
    assert again == exp and again.hash == exp.hash
    assert again.task.configs() == [(True, False), (True, True)] and again.task.total_steps(again) == 2
    assert EXP.task.configs() == [(True, False), (True, True), (False, False), (False, True)]


# ---- the tables and checks on hand-made records ----------------------------------------------------------
def fake_run(exp=EXP, scale: float = 1.0, keep_after_forward: bool = False):
    """A run-shaped object whose rank 0 recorded what the model predicts (totals x `scale`); with
    `keep_after_forward`, a resharding configuration that kept its units gathered."""
    us = model.units(exp)
    w = exp.world_size
    units = [FsdpUnit(u.name, [d * r for d, r in u.shapes], [d for d, _ in u.shapes], model.shard_bytes(u, w, 4),
                      w * model.shard_bytes(u, w, 4)) for u in us]
    configs = []
    for reshard, prefetch in exp.task.configs():
        samples = []
        for m in (m for m in model.timeline(exp, reshard, prefetch) if m["sampled"]):
            gathered = [i for i in range(len(us)) if i == m["unit"] and m["bytes"]["gathered_parameters"]]
            if keep_after_forward and reshard and m["event"] == "post-forward":
                gathered = [m["unit"]]
            total = int(m["total"] * scale)
            samples.append(MemorySample(m["event"], m["unit"], 0, m["bytes"], total, total, gathered))
        if not reshard:   # kept gathered: every unit is gathered at the loss
            samples = [MemorySample(s.event, s.unit, 0, s.bytes, s.total, s.total, list(range(len(us))))
                       if s.event == "loss" else s for s in samples]
        configs.append(FsdpConfigRecord(reshard, prefetch, samples, samples[0].total,
                                        int(model.peak(exp, reshard, prefetch) * scale), 1.0, 1.0))
    record = FsdpMemoryRecord(units, sum(u.numel for u in us) * 4, configs)
    return SimpleNamespace(spec=exp, ranks=[SimpleNamespace(rank=0, result=record)])


def test_peaks_table_puts_the_measured_peak_beside_the_estimate_and_the_prediction():
    t = views.peaks(fake_run())
    assert len(t) == 4 and (t["predicted_over_measured"] == 1.0).all() and (t["peak_over_estimate"] > 1).all()
    row = t.loc[("keep gathered, no prefetch", 0)]
    assert row["measured_peak_mib"] == pytest.approx(model.peak(EXP, False, False) / MIB, abs=1e-3)
    # where the peaks fall: in backward with resharding (so prefetch cannot move them), at the last
    # block's gather without it; prefetch shows as one more block in the forward's all-gather buffers
    assert t.loc[("reshard, prefetch", 0), "predicted_at"].startswith("post-backward blocks.")
    assert t.loc[("keep gathered, prefetch", 0), "predicted_at"] == f"copy-out blocks.{EXP.n_layers - 1}"
    assert t["at"].str.match(r"^(at|before) ").all() and "cuda_peak_mib" not in t
    block = 4 * model.shard_bytes(model.units(EXP)[2], 4, 4) / MIB
    comm = t["predicted_forward_comm_mib"].xs(0, level="rank")
    assert comm["reshard, prefetch"] - comm["reshard, no prefetch"] == pytest.approx(block, abs=1e-3)


def test_timeline_refuses_samples_that_do_not_line_up_with_the_model():
    run = fake_run()
    c = run.ranks[0].result.configs[0]
    dropped = FsdpConfigRecord(c.reshard_after_forward, c.prefetch, c.samples[:3] + c.samples[4:], c.held_at_start,
                               c.peak_bytes, c.loss, c.step_ms)
    run.ranks[0].result.configs[0] = dropped
    with pytest.raises(ValueError, match="differ first at sample 3: recorded post-forward pos_emb, predicted "
                                         "pre-forward pos_emb"):
        views.timeline(run, True, False)
    run.ranks[0].result.configs[0] = FsdpConfigRecord(c.reshard_after_forward, c.prefetch, c.samples[:-1],
                                                      c.held_at_start, c.peak_bytes, c.loss, c.step_ms)
    with pytest.raises(ValueError, match=r"samples \(31\).*differ first at sample 31: recorded \(nothing"):
        views.timeline(run, True, False)


def test_zero_measured_refuses_a_run_it_cannot_read_naming_it():
    with pytest.raises(ValueError, match="tables.fsdp_memory.zero_measured: `runs` got 'fsdp-memory-w4', a fsdp-memory run, and it reads train runs"):
        views.zero_measured([fake_run()])


def test_verify_fsdp_peak_predicted_fails_when_the_peak_is_off(capsys):
    views.verify_fsdp_peak_predicted(fake_run(scale=1.05))
    assert "verified:" in capsys.readouterr().out
    with pytest.raises(verify.CheckFailed, match=r"within 10%.*worst 33\.3% off"):
        views.verify_fsdp_peak_predicted(fake_run(scale=1.5))


def test_verify_reshard_frees_gathered_units_names_a_unit_kept_after_its_forward(capsys):
    views.verify_reshard_frees_gathered_units(fake_run())
    said = capsys.readouterr().out   # the counts it compared, not "as described"
    assert "reshard, no prefetch: 0 of " in said and "units still gathered after their forward" in said
    with pytest.raises(verify.CheckFailed, match="reshard, no prefetch: tok_emb, pos_emb, blocks.0"):
        views.verify_reshard_frees_gathered_units(fake_run(keep_after_forward=True))


def test_timeline_table_lines_up_the_prediction_with_every_sample():
    t = views.timeline(fake_run(), True, True)
    assert list(t.columns[3:3 + len(SAMPLE_CATEGORIES)]) == list(SAMPLE_CATEGORIES)
    assert (t["total_mib"] - t["predicted_total_mib"]).abs().max() < 1e-3
    with pytest.raises(ValueError, match="no configuration"):
        views.timeline(fake_run(Experiment(world_size=4, task=FsdpMemory(prefetch=False), **dict(
            d_model=64, n_layers=1))), True, True)


# ---- real runs: 4 ranks, one launch each ------------------------------------------------------------------
@pytest.fixture(scope="module")
def fsdp_run(chapter09_runs):
    return chapter09_runs[fsdp_configs().name]   # launched with the rest of chapter 09 (conftest)


@pytest.mark.slow
def test_predicted_peak_is_within_10_percent_of_the_measured_peak_everywhere(fsdp_run, capsys):
    views.verify_fsdp_peak_predicted(fsdp_run, tolerance=0.10)
    assert "verified:" in capsys.readouterr().out


@pytest.mark.slow
def test_a_prediction_that_ignores_gathered_units_fails_the_check(fsdp_run):
    def state_and_activations(exp, reshard, prefetch, rank):
        return sum(model.sharded_state(exp, rank).values()) + activation_bytes(exp, rank)

    with pytest.raises(verify.CheckFailed, match="NOT verified"):
        views.verify_fsdp_peak_predicted(fsdp_run, predictor=state_and_activations)


@pytest.mark.slow
def test_the_timeline_frees_units_with_reshard_and_keeps_them_without(fsdp_run):
    views.verify_reshard_frees_gathered_units(fsdp_run)
    units = fsdp_run.ranks[0].result.units
    for c in fsdp_run.ranks[0].result.configs:
        forward = [s for s in c.samples if s.event in ("pre-forward", "post-forward")]
        most = max(s.bytes["gathered_parameters"] for s in forward)
        expected = sum(u.gathered_bytes for u in units) if not c.reshard_after_forward else \
            max(u.gathered_bytes for u in units)
        assert most == expected
        assert c.samples[-1].bytes["gathered_parameters"] == 0 and c.samples[-1].gathered_units == []


@pytest.mark.slow
def test_blocks_are_gathered_twice_with_resharding_and_once_kept(fsdp_run):
    counts = views.gather_counts(fsdp_run)
    blocks = [c for c in counts.columns if c.startswith("blocks.")]
    assert len(blocks) == fsdp_run.spec.n_layers and len(counts) == 4
    for label, row in counts.iterrows():
        assert row[blocks].tolist() == [2 if label.startswith("reshard") else 1] * len(blocks), (label, row)


@pytest.mark.slow
def test_the_predicted_timeline_follows_every_sample(fsdp_run):
    for reshard, prefetch in fsdp_run.spec.task.configs():
        for rank in range(4):
            t = views.timeline(fsdp_run, reshard, prefetch, rank)
            assert ((t["predicted_total_mib"] / t["total_mib"] - 1).abs() < 0.05).all(), (reshard, prefetch, rank)


@pytest.mark.slow
def test_shards_are_torchs_padded_dim0_chunks_and_the_peak_exceeds_the_estimate(fsdp_run):
    for r in fsdp_run.ranks:
        t = views.units(fsdp_run, r.rank)
        assert (t["shard_bytes"] == t["predicted_shard_bytes"]).all()
        assert t.loc["tok_emb", "padding_bytes"] == (63 * 4 - 250) * fsdp_run.spec.d_model * 4
        for c in r.result.configs:
            assert c.held_at_start == model.sharded_state(fsdp_run.spec, r.rank)["sharded_parameters"] + \
                model.sharded_state(fsdp_run.spec, r.rank)["optimizer_state"]
            for s in c.samples:   # every byte is in a category: what is left is small and never negative
                assert -1024 <= s.bytes["other"] <= 0.05 * s.total
    t = views.peaks(fsdp_run)
    assert t["peak_over_estimate"].min() > 1.5
    # the measured peak falls where the model puts it (the same unit), and prefetch holds one more block's
    # all-gather output in the forward, as predicted; on the CPU there is no allocator peak
    assert (t["at"].str.split().str[-1] == t["predicted_at"].str.split().str[-1]).all()
    assert ((t["forward_comm_mib"] - t["predicted_forward_comm_mib"]).abs() < 0.01).all()
    block = fsdp_run.ranks[0].result.units[2].gathered_bytes / MIB
    for reshard in (True, False):
        comm = t[t["reshard_after_forward"] == reshard].groupby("prefetch")["forward_comm_mib"].min()
        assert comm[True] - comm[False] == pytest.approx(block, rel=0.01)
    assert all(c.cuda_peak_bytes is None for r in fsdp_run.ranks for c in r.result.configs)


@pytest.mark.slow
def test_memory_over_step_figure_has_a_panel_per_configuration(fsdp_run):
    import matplotlib

    matplotlib.use("Agg")
    from ddplab.plots.fsdp_memory import memory_over_step

    fig = memory_over_step(fsdp_run, detached=True)
    titles = [ax.get_title("left") for ax in fig.axes if ax.get_title("left")]
    assert len(titles) == 4 and titles[0].startswith("reshard, no prefetch (rank 0): measured peak")
    assert fig.axes[0].get_ylabel() == "live memory (MiB)"


@pytest.fixture(scope="module")
def zero_runs(chapter09_runs):
    return [chapter09_runs[e.name] for e in zero_stages_measured()]   # launched with the rest of chapter 09


@pytest.mark.slow
def test_zero_stages_match_to_the_byte_and_the_even_split_does_not(zero_runs, capsys):
    t = views.zero_measured(zero_runs)
    assert sorted(set(t.index.get_level_values("stage"))) == [0, 1, 3]
    assert (t["measured_bytes"] == t["exact_bytes"]).all()
    views.verify_zero_exact(zero_runs)
    assert "verified:" in capsys.readouterr().out
    # torch's whole-tensor ZeRO-1: the two 4096-row tensors make ranks 0 and 1 hold far more than K Psi / N
    zero1 = t.loc[1]
    assert (zero1.loc[[0, 1], "exact_minus_even_mib"] > 0.5).all() and (zero1.loc[[2, 3], "exact_minus_even_mib"] < -0.5).all()
    assert zero1["measured_bytes"].sum() == pytest.approx(zero1["even_bytes"].sum(), rel=1e-4)   # the same in all
    with pytest.raises(verify.CheckFailed, match=r"even prediction.*worst stage 1"):
        views.verify_zero_exact(zero_runs, predicted="even_bytes")
    # stages 0 and 3: the even split is right but for 4-byte Adam step counters (and FSDP2's padding)
    assert (t.loc[[0, 3], "measured_over_even"] - 1).abs().max() < 1e-3
