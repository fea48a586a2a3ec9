"""torch's witnesses beside ddplab's diagnosis: the ranks' testimonies read as checked JSON, torch's
flight-recorder analyzer over them, and the check that both name the same rank. The records in
tests/support/witness are a real 2-rank gloo run's (the stall fault on rank 1 at step 1, torch 2.13),
their stacks trimmed."""

from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path

import pytest

from ddplab import releases, verify, witnesses
from ddplab.failures import Diagnosis

RECORDS = Path(__file__).parent.parent / "support" / "witness"


def _stall():
    return witnesses.read(RECORDS, 2, prefix="stall.")


def test_the_analyzer_names_the_rank_that_never_joined_the_collective():
    t = _stall()
    assert sorted(t) == [0, 1]
    v = witnesses.flight_verdict(t, 2)
    assert v.ranks == [1] and v.how == "missing" and v.seq == 10 and v.collective == "gloo:all_reduce", str(v)
    assert "Not all ranks joining collective, sequence number: 10" in v.said and "missing ranks: {1}" in v.said
    assert witnesses.verify_same_rank([1], v).startswith("ddplab and torch's analyzer name the same rank(s): 1")


def test_the_check_fails_when_ddplab_and_torch_name_different_ranks():
    v = witnesses.flight_verdict(_stall(), 2)
    with pytest.raises(verify.CheckFailed, match="torch's flight recorder analyzer names"):
        witnesses.verify_same_rank([0], v)


def test_records_where_every_rank_joined_name_no_rank_and_are_not_compared():
    t = copy.deepcopy(_stall())
    t[0]["flight"]["entries"] = t[0]["flight"]["entries"][:-1]   # rank 0's collective #10 taken away: all agree
    v = witnesses.flight_verdict(t, 2)
    assert v.ranks == [] and "every rank with a record joined" in v.why_not
    assert witnesses.verify_same_rank([1], v).startswith("not compared")


def test_a_rank_without_testimony_is_said_and_nothing_is_guessed():
    v = witnesses.flight_verdict({0: _stall()[0]}, 2)
    assert v.ranks == [] and "rank(s) 1 left no testimony" in v.why_not and v.dumps == [0]


def test_a_rank_list_that_would_run_code_in_torchs_analyzer_is_never_handed_to_it(tmp_path):
    """torch's builder `eval`s a group's rank list when it parses as a string: the lab never passes the
    dump's group table on (it writes its own from the entries), so no code runs and the verdict stands."""
    marker = tmp_path / "ran"
    t = copy.deepcopy(_stall())
    for rank in t:
        t[rank]["flight"]["pg_config"][""]["ranks"] = repr(f"__import__('pathlib').Path({str(marker)!r}).touch()")
    v = witnesses.flight_verdict(t, 2)
    assert not marker.exists() and v.ranks == [1], str(v)
    from torch.distributed.flight_recorder.components.builder import build_groups_memberships

    with pytest.raises(Exception):   # what torch itself does with it: refuses it, having run it or not
        build_groups_memberships({0: t[0]["flight"]["pg_config"]})
    # the hazard is real exactly where the release probe says so (torch 2.13 evaluates, 2.14 does not)
    assert marker.exists() == releases.fact("analyzer_evaluates_rank_lists")


def test_groups_are_rebuilt_from_the_entries_not_from_the_dumps_table():
    """torch 2.13 with gloo: once a process made other groups, its dump's table says {"": ranks "[]"};
    the entries of the default group "0" and of a subgroup "2" are matched all the same."""
    t = copy.deepcopy(_stall())
    for rank in t:
        t[rank]["flight"]["pg_config"] = {"": {"desc": "", "name": "", "ranks": "[]"}}
        sub = copy.deepcopy(t[rank]["flight"]["entries"][0])
        sub.update(process_group=["2", "undefined"], collective_seq_id=1, record_id=-1)
        t[rank]["flight"]["entries"].insert(0, sub)
    v = witnesses.flight_verdict(t, 2)
    assert v.ranks == [1] and v.seq == 10 and v.group == "0:default_pg", str(v)


def test_malformed_or_oversized_testimonies_are_skipped(tmp_path, monkeypatch):
    for r in (0, 1):
        shutil.copy(RECORDS / f"stall.rank{r}.witness.json", tmp_path / f"rank{r}.witness.json")
    (tmp_path / "rank1.witness.json").write_text("{not json")
    assert sorted(witnesses.read(tmp_path, 2)) == [0]
    (tmp_path / "rank1.witness.json").write_text(json.dumps({"rank": 0, "stacks": {}}))   # another rank's
    assert sorted(witnesses.read(tmp_path, 2)) == [0]
    monkeypatch.setattr(witnesses, "MAX_BYTES", 100)
    assert witnesses.read(tmp_path, 2) == {}


def test_a_stack_shows_the_learners_frames_and_folds_the_librarys():
    text = witnesses.stack(_stall()[1])
    assert "train.py" in text and "inject_fault" in text and "time.sleep" in text
    frames = [{"file": "/x/site-packages/torch/a.py", "line": 1, "function": "f", "code": "f()"}] * 3 + \
        [{"file": "/home/me/train.py", "line": 9, "function": "step", "code": "dist.all_reduce(t)"},
         {"file": "/x/site-packages/torch/distributed/c10d.py", "line": 5, "function": "all_reduce", "code": "work.wait()"}]
    shown = witnesses.stack({"stacks": {"MainThread": frames}}).splitlines()
    assert shown == ["  ... 3 library frame(s)", "  train.py:9 in step: dist.all_reduce(t)",
                     "  c10d.py:5 in all_reduce: work.wait()"]


def test_the_diagnosis_prints_torchs_verdict_and_the_stacks_beside_its_own():
    v = witnesses.flight_verdict(_stall(), 2)
    d = Diagnosis("hang", [1], "Rank 1 never arrived.", flight=v, stacks={1: witnesses.stack(_stall()[1])})
    text = str(d)
    assert "rank(s) 1 never joined collective #10 of group 0:default_pg (gloo:all_reduce)" in text
    assert "--- rank 1 when the launcher asked" in text and "inject_fault" in text


def test_a_cells_collective_is_numbered_from_the_cells_start_and_torchs_number_explained(tmp_path):
    """In a `%%ddp` cell torch's sequence number counts the session's start-up barrier and earlier cells'
    collectives (issue 53: a learner's first all-reduce read "#2"); each rank notes where the cell began."""
    for before, said in ((9, "#1 of this cell in group 0:default_pg (gloo:all_reduce; torch's flight recorder numbers it "
                              "#10, after the session's start-up barrier and 8 collective(s) of earlier cells)"),
                         (1, "#9 of this cell in group 0:default_pg (gloo:all_reduce; torch's flight recorder numbers it "
                             "#10, after the session's start-up barrier)")):
        for r, t in _stall().items():
            (tmp_path / f"job3.rank{r}.witness.json").write_text(json.dumps({**t, "seqs_at_start": {"0": before}}))
        verdict, _ = witnesses.testimony(tmp_path, 2, prefix="job3.")
        assert verdict.earlier == before and f"rank(s) 1 never joined collective {said}" in str(verdict), str(verdict)
    (tmp_path / "job3.rank1.witness.json").write_text(json.dumps({**_stall()[1], "seqs_at_start": {"0": 8}}))
    verdict, _ = witnesses.testimony(tmp_path, 2, prefix="job3.")   # the ranks disagree: torch's number alone
    assert verdict.earlier is None and "never joined collective #10 of group 0:default_pg (gloo:all_reduce)" in str(verdict)


def test_a_rank_that_called_another_collective_is_what_torch_calls_the_culprit():
    t = copy.deepcopy(_stall())
    other = copy.deepcopy(t[0]["flight"]["entries"][-1])   # rank 0's collective #10, an all_reduce
    other["profiling_name"] = "gloo:broadcast"
    t[1]["flight"]["entries"].append(other)               # rank 1 calls a broadcast there instead
    v = witnesses.flight_verdict(t, 2)
    assert v.ranks == [1] and v.how == "mismatch" and v.seq == 10, str(v)
    assert "called something other than the lowest rank's gloo:all_reduce at collective #10" in str(v)
    assert "COLLECTIVE_TYPE_MISMATCH" in v.said


def test_the_witness_signal_reaches_only_living_ranks(tmp_path):
    """A recycled pid, torchrun's agent and a zombie never get SIGUSR2 (its default action would end them)."""
    import subprocess
    import sys

    from ddplab.processes import ask_witnesses, is_live_rank, start_ticks

    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    agent_like = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "-m", "ddplab.rank.worker"])
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        zombie_deadline = __import__("time").monotonic() + 10
        while Path(f"/proc/{zombie.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert __import__("time").monotonic() < zombie_deadline
        assert not is_live_rank(other.pid) and not is_live_rank(agent_like.pid) and not is_live_rank(zombie.pid)
        assert ask_witnesses({0: (other.pid, None), 1: (agent_like.pid, None), 2: (zombie.pid, None)},
                             lambda r: tmp_path / f"rank{r}.witness.json", wait_s=0.2) == []
        ticks = start_ticks(os.getpid())
        assert not is_live_rank(other.pid, ticks)   # a pid whose process started at another time is another process
        assert other.poll() is None and agent_like.poll() is None   # not signalled
    finally:
        for p in (other, agent_like, zombie):
            p.kill()
            p.wait()


def test_a_rank_survives_the_witness_signal_in_any_thread():
    """Blocked everywhere but the witness thread, and a do-nothing handler where a thread unblocks it."""
    import subprocess
    import sys

    code = ("import os, signal, threading, time\n"
            "from ddplab.rank import witness\n"
            "witness.block_signal()\n"
            "os.kill(os.getpid(), witness.SIGNAL)\n"             # before the witness thread exists: stays pending
            "def loose():\n"
            "    signal.pthread_sigmask(signal.SIG_UNBLOCK, {witness.SIGNAL})\n"
            "    signal.pthread_kill(threading.get_ident(), witness.SIGNAL)\n"
            "t = threading.Thread(target=loose); t.start(); t.join()\n"
            "witness.start(); time.sleep(0.3)\n"
            "print('alive')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "alive", out.stderr

