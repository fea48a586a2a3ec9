"""The two most important notebook checks can fail: each passes on a correct real run and
raises `verify.CheckFailed` for a deliberately wrong input. The tests call the same library functions
the notebooks' cells call (`tables.<module>.verify_*`), so a check that could no longer fail would show here:

    01, the synchronized gradient: every rank holds the global-batch gradient after the all-reduce;
    02, replicated memory: parameters, gradients, buckets and optimizer state as the model predicts.

Notebook 06's count of the distinct examples each step was handed is a fact about the sharding rule,
printed (`tables.global_batch.distinct_examples`); its line is tested here on a run that drops half the
examples and on ranks that read the same shard.

The wrong inputs are real runs where the lab can configure them (a rank-mean loss over unequal local
batches, ranks that never synchronize, a data path that drops half the examples) and otherwise a
mutation of a recorded run (a prediction made for another spec, ranks that read the same shard).
One 2-rank launch runs every experiment, 1-2 steps of a small model.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from ddplab import recipes, tables, verify
from tests.support import share

ROOT = Path(__file__).resolve().parents[2]

# small models: the checks do not depend on the size
SMALL = dict(d_model=32, n_layers=1, n_heads=2, vocab_size=32, seq_len=8)

GRADIENT = recipes.gradient_run(world_size=2, local_batch=4, name="key-gradient", **SMALL)
# notebook 01's naive normalization: each rank averages its own loss over unequal local batches
UNSIZED = {k: v for k, v in SMALL.items() if k != "seq_len"}
RANK_MEAN_UNEQUAL = recipes.unequal_work(local_batch=(2, 6), seq_len=(8, 8), **UNSIZED)[0].replace(
    name="key-gradient-rank-mean-unequal")
# notebook 01's alone_run: every rank steps on its own gradient, nothing is all-reduced
NO_SYNC = GRADIENT.replace(name="key-gradient-no-sync", sync="none")
MEMORY = recipes.memory_ledger(world_size=2, local_batch=4, optimizer="adam", name="key-memory", **SMALL)
# notebook 06: global batch 32 on 2 ranks, and its dropping run (half the local batch, same 32 asked)
EXAMPLES = recipes.strong_scaling(global_batch=32, world_sizes=(2,), steps=2, **SMALL)[0].replace(name="key-examples")
DROPS = EXAMPLES.replace(name="key-examples-drops-half", local_batch=EXAMPLES.local_batch // 2)


share("key-checks", lambda: [GRADIENT, RANK_MEAN_UNEQUAL, NO_SYNC, MEMORY, EXAMPLES, DROPS])


@pytest.fixture(scope="module")
def key_runs(shared_runs):
    return {r.spec.name: r for r in shared_runs["key-checks"]}


# ---- notebook 01: after the all-reduce every rank holds the global-batch gradient --------------------
@pytest.mark.slow
def test_gradient_check_passes_on_a_synchronized_run(key_runs, capsys):
    tables.gradients.verify_global_batch_gradient(tables.gradients.gradient_check(key_runs[GRADIENT.name]))
    assert "verified: after the all-reduce every rank holds the global-batch gradient" in capsys.readouterr().out


@pytest.mark.slow
def test_gradient_check_fails_when_the_rank_mean_loss_weighs_unequal_local_batches_equally(key_runs):
    check = tables.gradients.gradient_check(key_runs[RANK_MEAN_UNEQUAL.name])
    with pytest.raises(verify.CheckFailed, match="NOT verified: after the all-reduce every rank holds the global-batch"):
        tables.gradients.verify_global_batch_gradient(check)


@pytest.mark.slow
def test_gradient_check_fails_when_the_ranks_never_synchronize(key_runs):
    check = tables.gradients.gradient_check(key_runs[NO_SYNC.name])
    with pytest.raises(verify.CheckFailed, match="NOT verified: after the all-reduce every rank holds the global-batch"):
        tables.gradients.verify_global_batch_gradient(check)


# ---- notebook 02: the model state at its largest, on every rank, as predicted ------------------------
def _predicted_for(run, **wrong):
    """The recorded run with its prediction made for a spec it did not run (`memory` predicts from run.spec)."""
    return dataclasses.replace(run, spec=run.spec.replace(**wrong))


@pytest.mark.slow
def test_memory_check_passes_when_the_prediction_is_for_the_run_itself(key_runs, capsys):
    tables.memory.verify_model_state(tables.memory.memory_table(key_runs[MEMORY.name]))
    out = capsys.readouterr().out
    assert all(f"verified: {c} at their largest, on every rank, as predicted" in out
               for c in ("parameters", "gradients", "ddp_buckets", "optimizer_state")), out


@pytest.mark.slow
@pytest.mark.parametrize("wrong, fails", [
    (dict(optimizer="sgd"), "optimizer_state"),   # plain SGD keeps no state; the run used Adam (2 copies)
    (dict(sync="none"), "ddp_buckets"),           # no DDP, so no bucket buffers; the run had DDP's
    (dict(dtype="float64"), "parameters"),        # 8 bytes per element; the run held 4
], ids=["wrong-optimizer", "no-ddp-buckets", "wrong-dtype"])
def test_memory_check_fails_when_the_prediction_assumes_the_wrong_spec(key_runs, wrong, fails):
    table = tables.memory.memory_table(_predicted_for(key_runs[MEMORY.name], **wrong))
    with pytest.raises(verify.CheckFailed, match=f"NOT verified: {fails} at their largest, on every rank, as predicted"):
        tables.memory.verify_model_state(table)


# ---- notebook 06: the distinct examples each optimizer step was handed -----------------------
def _rank_reads_rank_0s_shard(run, rank: int = 1):
    """The recorded run with `rank`'s sample ids replaced by rank 0's, step by step: two ranks read one shard."""
    r0, wrong = run.ranks[0], run.ranks[rank]
    steps = [dataclasses.replace(mine, sample_ids=list(theirs.sample_ids)) for mine, theirs in zip(wrong.steps, r0.steps)]
    wrong = dataclasses.replace(wrong, result=dataclasses.replace(wrong.result, steps=steps))
    return dataclasses.replace(run, ranks=[wrong if r.rank == rank else r for r in run.ranks])


@pytest.mark.slow
def test_the_examples_line_counts_what_the_ranks_were_handed(key_runs):
    line = tables.global_batch.distinct_examples([key_runs[EXAMPLES.name], key_runs[DROPS.name]])
    assert "key-examples: 32 distinct example ids in each of its 2 optimizer steps;" in line
    assert "key-examples-drops-half: 16 distinct example ids" in line and "twice" not in line


@pytest.mark.slow
def test_the_examples_line_says_when_two_ranks_read_the_same_shard(key_runs):
    line = tables.global_batch.distinct_examples(_rank_reads_rank_0s_shard(key_runs[EXAMPLES.name]))
    assert "16 distinct example ids" in line and "(32 extra copies of ids over those steps)" in line


# ---- the notebooks run these same checks -------------------------------------------------------------
@pytest.mark.parametrize("notebook, call", [
    ("01_synchronized_gradient.ipynb", "tables.gradients.verify_global_batch_gradient("),
    ("02_replicated_memory.ipynb", "tables.memory.verify_model_state("),
])
def test_the_notebook_runs_the_check_tested_here(notebook, call):
    cells = json.loads((ROOT / "notebooks" / notebook).read_text())["cells"]
    assert any(call in "".join(c["source"]) for c in cells if c["cell_type"] == "code"), f"{notebook} lost {call}"
