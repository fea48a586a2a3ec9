"""ddplab.guard against two faults in a plain DDP script (tests/guard/faulty_loop.py, 2 gloo ranks):
a rank that stops before its forward, leaving the other inside DDP's collectives where no guard hook
runs, is named by the watcher; a parameter registered after DDP wrapped the model is blamed on that."""

from __future__ import annotations

from pathlib import Path

import pytest

import ddplab

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).with_name("faulty_loop.py")
NAMED = "ddplab.guard, step 5: rank 1 stopped stepping: rank 1 "
WHERE = {"forward": "has not begun step 5", "backward": "is in step 5, before its backward"}


@pytest.mark.parametrize("at", ["forward", "backward"])
def test_a_rank_that_stops_between_steps_is_named_and_the_waiting_rank_ends(at):
    # rank 1 sleeps 600 s: without the watcher, rank 0 waits in DDP's collectives and the run meets timeout_s
    done = ddplab.run_script(SCRIPT, "stops", "--at", at, "--sleep", "600", "--timeout", "5",
                             world_size=2, timeout_s=240)
    assert done.returncode != 0, done.output[-3000:]
    said = done.ranks[0]
    assert NAMED + WHERE[at] + ", unchanged for over 5 s" in said, said[-3000:]
    assert "ddplab.guard ends rank 0 (exit code 1)" in said and "Connection closed" not in said, said[-3000:]
    assert "ends rank 1" not in done.output


def test_a_rank_that_stops_before_its_optimizer_step_is_named_by_the_check_on_every_rank():
    done = ddplab.run_script(SCRIPT, "stops", "--at", "step", "--sleep", "600", "--timeout", "5",
                             world_size=2, timeout_s=240)
    assert done.returncode != 0, done.output[-3000:]
    (line,) = done.json_lines()   # rank 0 raised; torchrun stopped rank 1, asleep
    assert line["rank"] == 0 and line["kinds"] == ["rank-missing"], line
    assert line["error"].startswith("ddplab.guard, step 5: rank 1 did not reach the guard's check within 5 s"), line
    assert line["error"].endswith("; if a rank works alone between steps (evaluation, saving), raise timeout_s above "
                                  "that time"), line   # rank 1 might have been evaluating on its own


def test_in_warn_mode_a_rank_that_stopped_is_named_on_every_rank_and_training_goes_on():
    done = ddplab.run_script(SCRIPT, "stops", "--at", "forward", "--sleep", "15", "--timeout", "4",
                             "--on-problem", "warn", world_size=2, timeout_s=240)
    assert done.returncode == 0, done.output[-3000:]
    lines = {x["rank"]: x for x in done.json_lines()}
    assert [lines[r]["steps"] for r in (0, 1)] == [8, 8] and lines[0]["problems"] == lines[1]["problems"]
    (problem,) = lines[0]["problems"]
    assert (problem["kind"], problem["step"], problem["ranks"]) == ("rank-stopped", 5, [1]), problem
    assert all(NAMED + WHERE["forward"] in done.ranks[r] for r in (0, 1))


def test_a_parameter_registered_after_ddp_wrapped_the_model_is_blamed_on_that():
    done = ddplab.run_script(SCRIPT, "late-parameter", world_size=2, timeout_s=240)
    assert done.returncode == 0, done.output[-3000:]
    lines = {x["rank"]: x for x in done.json_lines()}
    assert lines[0]["error"] == lines[1]["error"] and lines[0]["kinds"] == ["replicas-differ", "unsynced-gradients"]
    text = lines[0]["error"]
    assert "late was registered on the model after DDP wrapped it" in text and "a hook, clipping" not in text, text
