"""An NCCL hang diagnosed by rank, from what NCCL leaves when its watchdog aborts
the ranks: the watchdog's log line, and the flight recorder's dump. No GPU here: the inputs are
written as NCCL writes them, and `bench/gpu_check.py` provokes the real thing on a GPU machine."""

from __future__ import annotations

import pickle

from ddplab import deaths, failures
from ddplab.spec.train import Train

PHASES = Train().all_phases()


def _line(rank: int, seq: int, op: str = "ALLREDUCE") -> str:
    return (f"[rank{rank}]:[E1202 05:01:02.123456 4242 ProcessGroupNCCL.cpp:632] [PG ID 0 PG GUID 0(default_pg) "
            f"Rank {rank}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType={op}, "
            f"NumelIn=1, NumelOut=1, Timeout(ms)=5000) ran for 5004 milliseconds before timing out.")


def _dump(path, entries):
    path.write_bytes(pickle.dumps({"version": "2.10", "pg_config": {}, "entries": entries}))


def _entry(seq, name="nccl:all_reduce", state="scheduled", pg=("0", "default_pg")):
    return {"collective_seq_id": seq, "profiling_name": name, "state": state, "process_group": pg}


def test_the_watchdog_line_names_the_rank_its_collective_and_sequence_number():
    d = deaths.deaths_from("\n".join([_line(0, 7), "noise", _line(1, 7), _line(1, 8)]))
    assert d.nccl_timeouts == {0: (7, "ALLREDUCE"), 1: (7, "ALLREDUCE")}   # each rank's first timeout
    assert deaths.deaths_from("gloo says nothing of the kind").nccl_timeouts == {}


def test_the_flight_recorder_says_how_far_each_rank_got_in_the_shared_group(tmp_path):
    for r in (0, 1):
        _dump(tmp_path / f"{deaths.FLIGHT_PREFIX}{r}", [_entry(s, state="completed") for s in range(1, 6)]
              + [_entry(6, state="started")])
    # rank 2 skipped its backward: five collectives in the training group, and a barrier on a group of its own
    _dump(tmp_path / f"{deaths.FLIGHT_PREFIX}2", [_entry(s, state="completed") for s in range(1, 6)]
          + [_entry(1, "nccl:barrier", pg=("1", "side"))])
    flight = deaths.flight_records(tmp_path, 3)
    assert flight == {0: {"seq": 6, "name": "nccl:all_reduce", "state": "started"},
                      1: {"seq": 6, "name": "nccl:all_reduce", "state": "started"},
                      2: {"seq": 5, "name": "nccl:all_reduce", "state": "completed"}}


def test_a_dump_that_is_not_plain_data_is_not_unpickled(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("unpickled!",))
    (tmp_path / f"{deaths.FLIGHT_PREFIX}0").write_bytes(pickle.dumps({"entries": [Evil()]}))
    (tmp_path / f"{deaths.FLIGHT_PREFIX}1").write_bytes(b"not a pickle")
    assert deaths.flight_records(tmp_path, 2) == {}


def _progress(rank, phase, step=0, collective=None):
    rec = {"rank": rank, "phase": phase, "step": step, "t_ns": 1}
    if collective:
        rec["collective"] = collective
    return [{"rank": rank, "phase": "build", "step": -1, "t_ns": 0}, rec]


def test_an_nccl_hang_names_the_rank_that_never_arrived_not_a_missing_result():
    progress = {0: _progress(0, "backward", collective="gradient all-reduce"),
                1: _progress(1, "backward", collective="gradient all-reduce"),
                2: _progress(2, "skip-backward", collective="barrier")}
    log = "\n".join([_line(0, 6), _line(1, 6)])
    dead = deaths.deaths_from(log)
    d = failures.diagnose(progress, {}, set(), 3, 5.0, False, PHASES, None, dead)
    assert d.kind == "hang" and d.ranks == [2], (d.kind, d.ranks, d.summary)
    assert "NCCL's watchdog timed out ranks 0, 1" in d.summary and "collective #6 (allreduce)" in d.summary
    # without the watchdog's lines the same silent exit reads as results that went missing
    assert failures.diagnose(progress, {}, set(), 3, 5.0, False, PHASES, None,
                             deaths.deaths_from("")).kind == "missing-result"


def test_the_flight_recorder_names_the_rank_behind_when_progress_cannot():
    progress = {r: _progress(r, "backward", collective="gradient all-reduce") for r in range(3)}
    dead = deaths.deaths_from("\n".join(_line(r, 6) for r in range(3)))
    dead.flight = {0: {"seq": 6, "name": "nccl:all_reduce", "state": "started"},
                     1: {"seq": 6, "name": "nccl:all_reduce", "state": "started"},
                     2: {"seq": 5, "name": "nccl:all_reduce", "state": "completed"}}
    d = failures.diagnose(progress, {}, set(), 3, 5.0, False, PHASES, None, dead)
    assert d.kind == "hang" and d.ranks == [2], (d.ranks, d.summary)
    assert "rank 2 last issued collective #5" in d.summary
