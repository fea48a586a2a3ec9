"""Checkpoint and resume (notebook 08): a right resume in a new launch is the uninterrupted run bit for
bit; each classic broken resume departs at the first resumed step; on another world size only the
sampler position counted over the whole world keeps every example of the epoch once. Fast tests check
the spec's refusals; the slow ones share two launches (the saving runs, then every resume)."""

from __future__ import annotations

import dataclasses
import json
import pickle
import shutil
from pathlib import Path

import pandas as pd
import pytest

import ddplab
from ddplab import Experiment, seal, verify
from ddplab.recipes import resume as recipes
from ddplab.spec.resume import Resume, SamplerPosition, checkpoint_dir, position_after, rank_state_file
from ddplab.tables import resume as tables
from tests.support import launch_leftovers, leftovers, share

MODEL = dict(recipes.RESUME_MODEL, world_size=2, local_batch=4)


def saving_run_dir(tmp_path, checkpoint=True, **fields):
    """A directory that looks like a finished saving run to the spec's checks (they read spec.json, look
    for the checkpoint's files and check their seal, never read into them)."""
    exp = Experiment(name="saved", task=Resume(save_at=6), **{**MODEL, **fields})
    d = tmp_path / "saved"
    d.mkdir(parents=True)
    (d / "spec.json").write_text(exp.to_json())
    if checkpoint:
        checkpoint_dir(d).mkdir()
        (checkpoint_dir(d) / ".metadata").write_text("")
        for r in range(exp.world_size):
            rank_state_file(d, r).write_text("")
        seal.sign(d, checkpoint_dir(d))
    return d


def resume_of(d, restore=("model", "optimizer", "sampler", "rng"), sampler_position="global", **fields):
    return Experiment(task=Resume(resume_from=str(d), restore=restore, sampler_position=sampler_position),
                      **{**MODEL, **fields})


# ---- the spec: refused before launch, naming the field ---------------------------------------------
def test_a_resume_spec_round_trips_through_json(tmp_path):
    exp = resume_of(saving_run_dir(tmp_path), restore=("model", "sampler"))
    assert Experiment.from_json(exp.to_json()) == exp
    assert exp.task.start_step() == 6 and exp.task.total_steps(exp) == exp.steps
    saving = Experiment(task=Resume(save_at=6), **MODEL)
    assert saving.task.total_steps(saving) == 6


@pytest.mark.parametrize("task, field", [
    (dict(dataset_size=7), "task.dataset_size"),            # fewer than one step of 2 x 4
    (dict(dataset_size="32"), "task.dataset_size"),
    (dict(augment_p=1.5), "task.augment_p"),
    (dict(save_at=0), "task.save_at"),
    (dict(save_at=10), "task.save_at"),                     # steps=10: nothing would be left to resume
    (dict(save_at=2.0), "task.save_at"),
    (dict(save_at=3, resume_from="runs/x"), "task.save_at"),
    (dict(resume_from=7), "task.resume_from"),
    (dict(restore=("model", "weights")), "task.restore"),
    (dict(restore=("model", "model")), "task.restore"),
    (dict(restore=("model",)), "task.restore"),              # nothing is resumed
    (dict(sampler_position="per-rank"), "task.sampler_position"),
])
def test_a_bad_setting_is_refused_naming_its_field(task, field):
    with pytest.raises(ValueError, match=rf"Experiment\.{field}:"):
        Experiment(task=Resume(**task), **MODEL)


def test_experiment_fields_the_task_cannot_honour_are_refused():
    with pytest.raises(ValueError, match=r"Experiment\.local_batch:"):
        Experiment(task=Resume(), **{**MODEL, "local_batch": (4, 2)})
    with pytest.raises(ValueError, match=r"Experiment\.probes: the resume task does not read it"):
        Experiment(task=Resume(), probes=("memory",), **MODEL)


def test_resume_from_must_be_a_saving_run_with_a_complete_checkpoint(tmp_path):
    with pytest.raises(ValueError, match=r"Experiment\.task\.resume_from: .* is not a run directory"):
        resume_of(tmp_path)
    with pytest.raises(ValueError, match=r"Experiment\.task\.resume_from: .* holds no complete checkpoint"):
        resume_of(saving_run_dir(tmp_path, checkpoint=False))
    other = tmp_path / "other"
    other.mkdir()
    (other / "spec.json").write_text(Experiment(task=Resume(), **MODEL).to_json())
    with pytest.raises(ValueError, match=r"Experiment\.task\.resume_from: .* is not a saving run"):
        resume_of(other)


@pytest.mark.parametrize("fields, field", [
    (dict(d_model=64), "d_model"),
    (dict(seq_len=8), "seq_len"),
    (dict(seed=1), "seed"),
    (dict(lr=1e-3), "lr"),                   # DCP would put the saved lr back with the optimizer state
    (dict(steps=6), "steps"),                # saved after 6 of them: nothing left
])
def test_a_resume_that_does_not_fit_its_checkpoint_is_refused_naming_the_field(tmp_path, fields, field):
    with pytest.raises(ValueError, match=rf"Experiment\.{field}:"):
        resume_of(saving_run_dir(tmp_path), **fields)


def test_another_lr_is_fine_when_the_optimizer_starts_afresh(tmp_path):
    resume_of(saving_run_dir(tmp_path), restore=("model", "sampler", "rng"), lr=1e-3)


def test_another_world_size_needs_the_rng_left_out_and_an_even_split_of_the_epoch(tmp_path):
    d = saving_run_dir(tmp_path)   # 2 ranks x 4, saved after 6 steps: 2 steps (16 examples) into epoch 1
    with pytest.raises(ValueError, match=r"Experiment\.task\.restore: 'rng'"):
        resume_of(d, world_size=4, local_batch=2)
    resume_of(d, restore=("model", "optimizer", "sampler"), world_size=4, local_batch=2)
    with pytest.raises(ValueError, match=r"Experiment\.task\.sampler_position: .* 16 examples into epoch 1"):
        resume_of(d, restore=("model", "optimizer", "sampler"), world_size=3, local_batch=2)


def test_the_sampler_position_is_counted_over_the_whole_world():
    # 32 ids over 2 ranks x 4: an epoch is 4 steps; after 6 steps each rank took 8 ids of epoch 1
    assert position_after(6, 32, 2, 4) == SamplerPosition(epoch=1, rank_offset=8, epoch_consumed=16)
    # an epoch that just ended stays the position: the next step starts epoch 1
    assert position_after(4, 32, 2, 4) == SamplerPosition(epoch=0, rank_offset=16, epoch_consumed=32)
    assert position_after(6, 32, 4, 2).epoch_consumed == 16   # the same global batch: the same place


def test_the_recipes_resume_only_a_saving_run(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "spec.json").write_text(Experiment(task=Resume(), **MODEL).to_json())
    with pytest.raises(ValueError, match="not a saving run"):
        recipes.resumes(other)
    with pytest.raises(ValueError, match="does not split evenly over 3 ranks"):
        recipes.world_size_resumes(saving_run_dir(tmp_path), world_size=3)


# ---- real runs: two launches, shared by every slow test ---------------------------------------------
share("resume-base", lambda: recipes.resume_baseline() + recipes.world_size_baseline())   # in the one shared launch


@pytest.fixture(scope="module")
def runs(runs_dir, shared_runs):
    """The saving runs (2 ranks with augmentation, 4 ranks without; the shared launch), then a new launch
    of every resume."""
    named = {r.spec.name: r for r in shared_runs["resume-base"]}
    copy = shutil.copytree(named["saved"].path, runs_dir / "resume-copy" / "saved")   # removed by a test below
    from_copy = dataclasses.replace(recipes.resumes(copy)[0], name="resume-from-copy")
    resumed = ddplab.run_many(recipes.resumes(named["saved"]) + recipes.world_size_resumes(named["saved-w4"])
                              + [from_copy], runs_dir / "resume-resumed", progress=False)
    named.update({r.spec.name: r for r in resumed})
    return named


BROKEN = ["resume-no-optimizer", "resume-epoch-0", "resume-no-rng"]


@pytest.mark.slow
def test_the_right_resume_is_bit_identical_to_the_uninterrupted_run_at_every_step(runs):
    ref, saved, right = runs["uninterrupted"], runs["saved"], runs["resume-right"]
    assert [s.step for s in right.ranks[0].steps] == list(range(6, 10))
    for rank in range(2):
        checksums = [s.param_checksum for s in ref.ranks[rank].steps]
        assert [s.param_checksum for s in saved.ranks[rank].steps] == checksums[:6]
        assert [s.param_checksum for s in right.ranks[rank].steps] == checksums[6:]
    tables.verify_resume_identical(ref, right)
    assert tables.departure(ref, right)["loss_diff"].max() == 0.0


@pytest.mark.slow
def test_the_resumes_start_where_they_say(runs):
    starts = {name: (runs[name].ranks[1].result.start_epoch, runs[name].ranks[1].result.start_offset)
              for name in ["resume-right", *BROKEN, "resume-adjusted-w2", "resume-unadjusted-w2"]}
    assert starts == {"resume-right": (1, 8), "resume-no-optimizer": (1, 8), "resume-epoch-0": (0, 0),
                      "resume-no-rng": (1, 8), "resume-adjusted-w2": (1, 8),   # 16 consumed / 2 ranks
                      "resume-unadjusted-w2": (1, 4)}                         # a 4-rank rank's own count


@pytest.mark.slow
def test_the_checkpoint_holds_model_and_adam_state_in_dcp_and_each_ranks_own_file(runs):
    saved = runs["saved"]
    params = saved.tensors(0)["params"].shape[1]
    assert (checkpoint_dir(saved.path) / ".metadata").exists()
    assert all(rank_state_file(saved.path, r).exists() for r in range(2))
    info = saved.ranks[0].result.saved
    assert (info.step, info.epoch, info.epoch_consumed) == (6, 1, 16)
    assert Path(info.path) == checkpoint_dir(saved.path) and Path(info.path).is_dir()   # not the staging folder
    assert info.dcp_bytes > 3 * 4 * params   # parameters, Adam's exp_avg and exp_avg_sq, float32


@pytest.mark.slow
def test_a_finished_resume_loads_after_its_saving_run_is_gone(runs):
    """A copy of the saving run resumes exactly as the original; once the copy is deleted, the resume's
    run directory still loads (reading checks the record, not the checkpoint it came from)."""
    done = runs["resume-from-copy"]
    shutil.rmtree(done.spec.task.resume_from)
    again = ddplab.load_run(done.path)
    assert [s.param_checksum for s in again.ranks[0].steps] == [s.param_checksum for s in
                                                                 runs["resume-right"].ranks[0].steps]


@pytest.mark.slow
def test_a_real_checkpoint_is_sealed_and_a_copy_with_a_malicious_metadata_runs_nothing(runs, tmp_path):
    """The saving run sealed what its ranks wrote; a copy verifies; a copy whose .metadata is a pickle
    that runs code when loaded is refused before any rank starts, and the code never runs."""
    saved = runs["saved"]
    files = json.loads(seal.seal_file(saved.path).read_text())["files"]
    assert {".metadata", "rank0.state.pt", "rank1.state.pt"} <= set(files) and any(f.endswith(".distcp") for f in files)
    copy = shutil.copytree(saved.path, tmp_path / "copy")
    recipes.resumes(copy)   # a copy is fine
    marker = tmp_path / "code-ran"
    (checkpoint_dir(copy) / ".metadata").write_bytes(
        pickle.dumps(type("Evil", (), {"__reduce__": lambda self: (Path.write_text, (marker, "x"))})()))
    with pytest.raises(ValueError, match=r"Experiment\.task\.resume_from: the checkpoint differs from what its "
                                         r"saving run sealed: .*\.metadata \(changed\)"):
        ddplab.run(recipes.resumes(copy)[0], out=tmp_path / "never")
    assert not marker.exists() and not (tmp_path / "never").exists()


@pytest.mark.slow
def test_a_checkpoint_changed_after_the_launchers_check_is_refused_by_the_ranks(runs, tmp_path, monkeypatch):
    """The window between the check and the read: the launcher checks the files, then
    someone replaces .metadata before the ranks load it. Each node's ranks load a private copy that they
    verified themselves, so the change is refused in the ranks and the pickle never runs."""
    from ddplab.launch import cold

    copy = shutil.copytree(runs["saved"].path, tmp_path / "copy")
    marker = tmp_path / "code-ran"
    evil = pickle.dumps(type("Evil", (), {"__reduce__": lambda self: (Path.write_text, (marker, "x"))})())
    checked = cold._keeps_its_sources

    def check_then_tamper(exps, out):
        checked(exps, out)
        (checkpoint_dir(copy) / ".metadata").write_bytes(evil)
    monkeypatch.setattr(cold, "_keeps_its_sources", check_then_tamper)
    with pytest.raises(ddplab.RunFailed, match=r"the checkpoint of .*copy could not be copied and verified on node 0 "
                                               r"before it was loaded .*\.metadata \(changed\)"):
        ddplab.run(recipes.resumes(copy)[0], out=tmp_path / "tampered", progress=False, warm=False)
    assert not marker.exists()
    said = [p.read_text() for p in tmp_path.rglob(".resume-source-node0/refused")]   # the failed run keeps why
    assert len(said) == 1 and ".metadata (changed)" in said[0]
    assert not list(tmp_path.rglob(".resume-source-node*/checkpoint")), "the tampered copy stayed behind"


@pytest.mark.slow
@pytest.mark.parametrize("name", BROKEN)
def test_each_broken_resume_departs_at_the_first_resumed_step_and_stays_departed(runs, name):
    ref, broken = runs["uninterrupted"], runs[name]
    d = tables.departure(ref, broken)
    assert d.attrs["first_departure"] == 6
    assert not d["identical"].any() and (d["param_distance"] > 0).all()
    with pytest.raises(verify.CheckFailed, match="step 6 departs first"):
        tables.verify_resume_identical(ref, broken)


@pytest.mark.slow
def test_the_adjusted_world_size_resume_sees_every_example_once_and_tracks_to_float_rounding(runs):
    ref, saved, adjusted = runs["uninterrupted-w4"], runs["saved-w4"], runs["resume-adjusted-w2"]
    cover = tables.coverage_across_resume(saved, adjusted).iloc[0]
    assert (cover["once"], cover["never"], cover["twice"], cover["epoch_finished"]) == (32, 0, 0, True)
    d = tables.departure(ref, adjusted)
    assert d["same_examples"].all()
    assert 0 < d["param_distance"].max() < 1e-4   # the same sums in another order: rounding, not bits
    tables.verify_resume_tracks(ref, adjusted)


@pytest.mark.slow
def test_the_unadjusted_world_size_resume_repeats_examples_and_leaves_the_reference(runs):
    ref, saved, unadjusted = runs["uninterrupted-w4"], runs["saved-w4"], runs["resume-unadjusted-w2"]
    cover = tables.coverage_across_resume(saved, unadjusted).iloc[0]
    # each new rank skips 4 of its ids instead of 8: 2 x 4 ids of the epoch come round again
    assert (cover["once"], cover["twice"], cover["never"]) == (24, 8, 0)
    assert not tables.departure(ref, unadjusted)["same_examples"].iloc[0]
    with pytest.raises(verify.CheckFailed, match=r"other examples in step\(s\) \[6"):
        tables.verify_resume_tracks(ref, unadjusted)


@pytest.mark.slow
def test_the_sampler_restarted_at_epoch_0_never_finishes_the_interrupted_epoch(runs):
    cover = tables.coverage_across_resume(runs["saved"], [runs["resume-right"], runs["resume-epoch-0"]])
    assert cover.loc["resume-right", "once"] == 32
    assert (cover.loc["resume-epoch-0", "never"], bool(cover.loc["resume-epoch-0", "epoch_finished"])) == (16, False)


@pytest.mark.slow
def test_no_rank_outlives_the_launches(runs, runs_dir):
    assert launch_leftovers(runs["saved"]) == [] and leftovers(runs_dir / "resume-resumed") == []


@pytest.mark.slow
def test_the_summary_puts_each_resume_where_it_departs(runs):
    broken = [runs[n] for n in ["resume-right", *BROKEN]]
    s = tables.resume_summary(runs["uninterrupted"], broken, saved=runs["saved"])
    save_at = runs["saved"].spec.task.save_at
    assert pd.isna(s.loc["resume-right", "first_departure"]) and s.loc["resume-right", "distance_last"] == 0
    assert (s.loc[BROKEN, "first_departure"] == save_at).all() and (s.loc[BROKEN, "distance_last"] > 0).all()
    assert s.loc["resume-epoch-0", "never_seen"] == 16 and not s.loc["resume-epoch-0", "same_examples"]
    moved = tables.resume_summary(runs["uninterrupted-w4"], [runs["resume-adjusted-w2"], runs["resume-unadjusted-w2"]],
                                  saved=runs["saved-w4"])
    assert moved["same_examples"].tolist() == [True, False] and moved["seen_twice_or_more"].tolist()[0] == 0
    assert moved.loc["resume-unadjusted-w2", "seen_twice_or_more"] > 0


@pytest.mark.slow
def test_a_saving_or_resumed_run_times_and_scores_the_steps_it_recorded(runs):
    saved, right = runs["saved"], runs["resume-right"]
    assert len(saved.step_ms()) == saved.spec.task.save_at and len(right.step_ms(1)) == len(right.ranks[0].steps) - 1
    ref = runs["uninterrupted"].global_loss()
    assert right.global_loss() == ref[right.ranks[0].result.start_step:]   # bit-identical: the same losses
