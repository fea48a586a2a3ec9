"""A `%%ddp` cell seen from the launcher (`launch/cells.py`): while it runs, where each rank is, read from
the ranks' own files and said in one line with how long each has waited and when the cell is stopped;
after a hang, where each rank was when its testimony was taken, from its stack and that state. The real
hang, and its time bound: tests/launch/test_magic.py."""

from __future__ import annotations

import json

from ddplab import processes
from ddplab.launch import cells
from ddplab.magic import CellResult

IN_ALL_REDUCE = {"state": "collective", "op": "all_reduce", "tensor": "shape (1,) float32", "n": 1, "since": 100.0}
FINISHED = {"state": "finished", "error": None, "since": 100.0}
# the stacks `witnesses.stack` gives of a rank inside a collective, and of one in the session's loop between jobs
STACK_IN_COLLECTIVE = ("  session.py:61 in serve: cells.run_cell(job['cell'], ns, status, stream))\n"
                       "  <%%ddp cell>:2 in <module>: dist.all_reduce(torch.ones(1))\n"
                       "  ... 2 library frame(s)\n  distributed_c10d.py:2950 in all_reduce: work.wait()")
STACK_IDLE = ("  session.py:51 in serve: job = wait_for(session_dir / f\"job{n}.json\", cfg.get(\"idle_s\"))\n"
              "  session.py:81 in wait_for: time.sleep(0.001 if idle < 1 else 0.005 if idle < 10 else 0.02)")


def test_a_hang_says_which_rank_waits_in_which_collective_and_for_how_long():
    assert cells.where({0: IN_ALL_REDUCE, 1: FINISHED}, 106.2) == (
        "rank 0: in dist.all_reduce #1 (shape (1,) float32) for 6 s; "
        "rank 1: finished the cell 6 s ago, waiting for the others")


def test_the_running_line_says_the_timeout_and_when_the_cell_is_stopped():
    note = cells.running_note({0: IN_ALL_REDUCE, 1: FINISHED}, 106.2, 100.0, timeout_s=10.0)
    assert note.startswith("running... 6 s: rank 0: in dist.all_reduce #1 (shape (1,) float32) for 6 s"), note
    assert note.endswith("A collective times out after 10 s; the cell is stopped by 15 s"), note


def test_ranks_in_one_state_are_said_together():
    running = {"state": "running", "since": 100.0}
    raised = {"state": "finished", "error": "ZeroDivisionError", "since": 103.0}
    assert cells.where({0: running, 1: raised, 2: running}, 104.0) == (
        "ranks 0, 2: running the cell's own code for 4 s; "
        "rank 1: finished the cell 1 s ago (it raised ZeroDivisionError), waiting for the others")


def test_the_states_are_read_from_the_ranks_files_and_timed_from_when_first_seen(tmp_path):
    states = cells._States(tmp_path, 7, [0, 1], t0=0.0)
    status = tmp_path / "job7.rank0.cell.status"
    call = {"op": "all_reduce", "tensor": "shape (1,) float32", "group": None, "n": 1}
    status.write_text(json.dumps({**call, "done": False}))
    (tmp_path / "job7.rank1.cell.json").write_text(json.dumps({"stdout": "", "stderr": "", "value": None,
                                                               "error": None}))
    seen = states.poll(0.25)
    assert seen[0] == {"state": "collective", "op": "all_reduce", "tensor": "shape (1,) float32", "n": 1,
                       "since": 0.25}
    assert seen[1] == {"state": "finished", "error": None, "since": 0.25}
    assert states.poll(5.0)[0]["since"] == 0.25   # the same collective: its wait goes on
    status.write_text(json.dumps({**call, "done": True, "raised": None}))
    assert states.poll(6.0)[0] == {"state": "running", "n": 1, "since": 6.0}
    status.write_text(json.dumps({**call, "n": 2, "done": False}))
    assert states.poll(7.0)[0]["since"] == 7.0   # the cell's next collective: a new wait


def test_a_rank_about_to_time_out_is_asked_for_its_testimony_while_it_still_waits():
    assert not cells._about_to_fail({0: IN_ALL_REDUCE, 1: FINISHED}, 108.9, timeout_s=10.0)
    assert cells._about_to_fail({0: IN_ALL_REDUCE, 1: FINISHED}, 109.0, timeout_s=10.0)
    assert not cells._about_to_fail({1: FINISHED}, 200.0, timeout_s=10.0)


def test_the_testimonies_and_the_teardown_fit_in_the_cells_grace():
    """A cell that never ends is asked for its testimonies, and stopped, within the timeout + CELL_GRACE_S."""
    assert cells.KILL_RESERVE_S + processes.WITNESS_WAIT_S + cells.LIVE_S < cells.CELL_GRACE_S


def test_the_rank_waiting_in_the_collective_is_not_called_idle_but_the_one_that_finished_is():
    assert cells.asked_where(IN_ALL_REDUCE, STACK_IN_COLLECTIVE, 109.0) == (
        "waiting in dist.all_reduce #1 (shape (1,) float32) for 9 s: the other ranks had not joined it")
    assert cells.asked_where(FINISHED, STACK_IDLE, 109.0) == "idle, between cells: it had finished this cell 9 s before"
    assert cells.asked_where(None, STACK_IDLE, 109.0) == "idle, between cells: it was not in this cell"
    # its collective had returned by the time it was asked: the stack says where it was
    assert cells.asked_where(IN_ALL_REDUCE, STACK_IDLE, 109.0) == "idle, between cells"


def test_the_cells_table_says_where_each_rank_was_when_asked():
    answers = {0: None, 1: {"stdout": "", "stderr": "", "value": None, "error": None}}
    asked = {0: cells.asked_where(IN_ALL_REDUCE, STACK_IN_COLLECTIVE, 109.0),
             1: cells.asked_where(FINISHED, STACK_IDLE, 109.0)}
    status = {0: {"op": "all_reduce", "tensor": "shape (1,) float32", "group": None, "n": 1, "done": False}}
    shown = CellResult(answers, 10.2, status=status,
                       witness=(None, {0: STACK_IN_COLLECTIVE, 1: STACK_IDLE}, asked))._repr_html_()
    assert "where rank 0 was when the launcher asked (waiting in dist.all_reduce #1 (shape (1,) float32)" in shown
    assert "where rank 1 was when the launcher asked (idle, between cells: it had finished this cell" in shown
    assert CellResult(answers, 10.2, status=status).failed[0].startswith(
        "never finished: still waiting in dist.all_reduce #1 (shape (1,) float32)")


def test_a_launch_waits_for_ranks_restarting_after_a_lost_cell_and_leaves_their_news(monkeypatch):
    import threading
    import time

    from ddplab.launch import cells, reuse

    done = []
    thread = threading.Thread(target=lambda: (time.sleep(0.3), done.append(1)))
    monkeypatch.setattr(cells, "_restart", {"thread": thread, "said": (True, "2 new ranks started in 0.3 s")})
    thread.start()
    assert reuse.for_launch([], "gloo", "cpu", False, 10.0) is None   # warm=False: cold, after the restart
    assert done == [1] and cells.restarted() == (True, "2 new ranks started in 0.3 s")
