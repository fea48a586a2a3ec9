"""ddplab.guard in a plain torchrun script (ddplab/examples/guarded_training.py), not a ddplab task: each silent
bug provoked on 2 and 4 ranks is caught with its message on every rank, and the clean loops (a plain
classifier for 1,000 steps, the right ways to weigh unequal batches and to accumulate) raise nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

import ddplab
from ddplab.examples import guarded_training

SCRIPT = Path(guarded_training.__file__)
BUGS = {   # scenario -> the problems the guard must name, and words its message must hold
    "same-data": ({"same-batch"}, "got the same batch"),
    "mean-loss": ({"loss-weights"}, "counts 2.00x one of rank 0"),
    "no-set-epoch": ({"sampler-repeats"}, "set_epoch"),
    "bn-unsynced": ({"buffers-differ"}, "running_mean"),
    "no-sync": ({"unsynced-gradients", "replicas-differ"}, "no_sync"),
    "outside-ddp": ({"unsynced-gradients", "replicas-differ"}, "not among the parameters DDP averages"),
}
CLEAN = ("clean", "weighted-right", "accumulate-right")


def torchrun(nproc: int, *args: str, timeout: float = 240) -> dict[tuple[str, int], dict]:
    """(scenario, rank) -> the script's line, from one torchrun launch of it (`ddplab.run_script`)."""
    done = ddplab.run_script(SCRIPT, *args, world_size=nproc, timeout_s=timeout)
    assert done.returncode == 0, done.output[-4000:]
    return {(x["scenario"], x["rank"]): x for x in done.json_lines()}


def check_bugs(results: dict, nproc: int) -> None:
    for scenario, (kinds, words) in BUGS.items():
        texts = {results[scenario, r]["error"] for r in range(nproc)}
        assert len(texts) == 1 and None not in texts, (scenario, texts)   # every rank raised the same error
        text = texts.pop()
        assert set(results[scenario, 0]["kinds"]) == kinds, (scenario, text)
        assert words in text, (scenario, text)
        print(f"{scenario}: {text.splitlines()[0][:160]}")


@pytest.mark.slow
def test_each_bug_is_caught_on_2_ranks_and_a_clean_loop_runs_1000_steps_without_an_alarm():
    results = torchrun(2, "--scenarios", *CLEAN, *BUGS, "stuck", "--clean-steps", "1000")
    for scenario in CLEAN:
        for r in range(2):
            got = results[scenario, r]
            assert got["error"] is None and got["kinds"] == [] and got["steps"] == (1000 if scenario == "clean" else 30), got
    assert results["clean", 0]["notes"] == ["sampler-uneven"]   # 203 examples over 2 ranks: one read twice
    check_bugs(results, 2)
    stuck = results["stuck", 0]["error"]
    assert stuck.startswith("ddplab.guard, step 3: rank 1 did not reach the guard's check within 3 s"), stuck
    assert results["stuck", 1]["error"] == stuck   # rank 1 arrived late, found the verdict, and raised it too


@pytest.mark.slow
def test_each_bug_is_caught_on_4_ranks():
    # the clean loops' 30 steps (5 epochs, 3 validations) on 4 ranks; the 1,000-step claim is the 2-rank test's
    results = torchrun(4, "--scenarios", *CLEAN, *BUGS, "stuck", "--clean-steps", "30")
    for scenario in CLEAN:
        assert all(results[scenario, r]["error"] is None and results[scenario, r]["steps"] == 30
                   for r in range(4)), scenario
    check_bugs(results, 4)
    stuck = results["stuck", 0]["error"]
    assert "rank 1 did not reach" in stuck and "while ranks 0, 2 and 3 waited" in stuck, stuck
    assert all(results["stuck", r]["error"] == stuck for r in range(4))


@pytest.mark.slow
def test_a_hugging_face_gpt2_loop_is_guarded_through_its_output_loss():
    pytest.importorskip("transformers")
    results = torchrun(2, "--model", "hf", "--scenarios", "clean", "same-data", "mean-loss", "no-sync",
                       "--clean-steps", "40")
    assert all(results["clean", r]["error"] is None and results["clean", r]["steps"] == 40 for r in range(2))
    assert results["same-data", 0]["kinds"] == ["same-batch"]
    # odd ranks get 4 rows and label all but their first 6 tokens -100: after GPT-2's shift by one, 5 of 11
    # count in each row, 20 in all, against rank 0's 8 x 11 (read from the loss's own autograd node)
    text = results["mean-loss", 0]["error"]
    assert results["mean-loss", 0]["kinds"] == ["loss-weights"] and "rank 0 over 88, rank 1 over 20" in text, text
    assert "no_sync" in results["no-sync", 0]["error"]


@pytest.mark.slow
def test_an_unchanged_script_is_guarded_through_python_m_ddplab_guard():
    import ddplab.guard.__main__ as wrapper

    done = ddplab.run_script(wrapper.__file__, SCRIPT, "--unguarded", "--scenarios", "clean", "same-data",
                             "no-set-epoch", "bn-unsynced", "outside-ddp", world_size=2, timeout_s=240)
    assert done.returncode == 0, done.output[-4000:]
    said = {(x["scenario"], x["rank"]): x for x in done.json_lines()}
    assert said["clean", 0]["error"] is None and said["clean", 1]["steps"] == 30
    assert [said[s, 0]["kinds"] for s in ("same-data", "no-set-epoch", "bn-unsynced", "outside-ddp")] == \
        [["same-batch"], ["sampler-repeats"], ["buffers-differ"], ["replicas-differ", "unsynced-gradients"]]


@pytest.mark.slow
def test_a_script_past_its_timeout_is_stopped_with_every_rank_and_its_last_words(tmp_path):
    import psutil

    script = tmp_path / "sleeps.py"
    script.write_text("import time\nprint('about to sleep', flush=True)\ntime.sleep(600)\n")
    with pytest.raises(TimeoutError, match="ran past timeout_s=10 s(.|\n)*about to sleep"):
        ddplab.run_script(script, world_size=2, timeout_s=10)
    alive = [p.info["cmdline"] for p in psutil.process_iter(["cmdline"]) if str(script) in " ".join(p.info["cmdline"] or [])]
    assert alive == []
