"""The guard's watcher (`ddplab/guard/watcher.py`) on one store, with stand-in guards whose positions the
test moves: it names a rank that sits behind a blocked one, and stays quiet while ranks are level or the
ahead rank keeps stepping (DDP's join())."""

from __future__ import annotations

import json
import time
import warnings
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

import ddplab.guard
from ddplab.guard.watcher import Watcher

TIMEOUT_S = 1.5


def watchers(*positions):
    store = dist.HashStore()
    guards = [SimpleNamespace(position=p, stopped=False, problems=[], rank=r, on_problem="warn")
              for r, p in enumerate(positions)]
    return guards, [Watcher(g, store, list(range(len(guards))), g.rank, TIMEOUT_S) for g in guards]


def wait_for(predicate, limit_s: float) -> bool:
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_a_rank_behind_a_blocked_one_is_named_by_every_rank_with_the_same_words():
    guards, ws = watchers((5, 1, 1), (5, 0, 0))
    try:
        assert wait_for(lambda: all(w.problem for w in ws), 60), "no rank named the one that stopped"
        assert ws[0].problem == ws[1].problem and ws[0].problem.ranks == (1,) and ws[0].problem.step == 5
        assert ws[0].problem.message.startswith("rank 1 stopped stepping: rank 1 has not begun step 5")
        # rank 1 may be working alone (an evaluation on one rank): the verdict says what to do then
        assert ws[0].problem.message.endswith(
            "; if a rank works alone between steps (evaluation, saving), raise timeout_s above that time.")
        assert all(g.stopped and g.problems == [ws[0].problem] for g in guards)
    finally:
        for w in ws:
            w.close()


def test_ranks_standing_level_are_not_named():
    guards, ws = watchers((3, 1, 1), (3, 1, 1))   # both in the same collective, or both in a long pause
    try:
        time.sleep(3 * TIMEOUT_S)
        assert [w.problem for w in ws] == [None, None] and not any(g.stopped for g in guards)
    finally:
        for w in ws:
            w.close()


def test_a_rank_that_left_the_loop_is_not_named_while_the_others_keep_stepping():
    guards, ws = watchers((3, 1, 1), (3, 1, 1), (2, 0, 0))
    try:
        end = time.monotonic() + 3 * TIMEOUT_S
        while time.monotonic() < end:   # ranks 0 and 1 keep stepping; rank 2 ran out of data (DDP's join())
            for g in guards[:2]:
                g.position = (g.position[0] + 1, 1, 1)
            time.sleep(0.05)
        assert [w.problem for w in ws] == [None, None, None]
    finally:
        for w in ws:
            w.close()


def test_a_rank_named_while_it_was_away_raises_the_verdict_at_its_next_forward():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))
        guard = ddplab.guard.attach(model, torch.optim.SGD(model.parameters(), lr=0.1), timeout_s=TIMEOUT_S)
        model(torch.ones(1, 2))   # no verdict yet: the forward goes on
        guard.exchange.store.set("stall", json.dumps({"missing": [0], "step": 0, "text": "rank 0 stopped stepping"}))
        guard._moved_at -= 2 * TIMEOUT_S   # as if this rank had been away longer than timeout_s
        with pytest.raises(ddplab.guard.GuardError, match="step 0: rank 0 stopped stepping"):
            model(torch.ones(1, 2))
        model(torch.ones(1, 2))   # raised once; the guard has stopped checking
        assert guard.stopped and [p.kind for p in guard.problems] == ["rank-stopped"]
        guard.close()
    finally:
        dist.destroy_process_group()


class FlakyStore:
    """A HashStore whose every call raises while `failing` calls are left to fail (-1: for ever)."""

    def __init__(self):
        self.store, self.failing = dist.HashStore(), 0

    def __getattr__(self, name):
        method = getattr(self.store, name)

        def call(*args):
            if self.failing:
                self.failing -= 1
                raise RuntimeError("store down")
            return method(*args)
        return call


def _flaky_watchers(failing: int):
    store = FlakyStore()
    guards = [SimpleNamespace(position=p, stopped=False, problems=[], rank=r, on_problem="warn")
              for r, p in enumerate([(5, 1, 1), (5, 0, 0)])]
    ws = [Watcher(g, store, [0, 1], g.rank, TIMEOUT_S) for g in guards]   # each posts its position first
    store.failing = failing
    return ws


def test_a_store_error_that_passes_is_retried_and_the_watcher_goes_on():
    ws = _flaky_watchers(failing=2)   # fewer errors in a row than STORE_TRIES, on either watcher
    try:
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            assert wait_for(lambda: all(w.problem for w in ws), 60), "the watchers gave up after a passing error"
        assert not [w for w in said if "watcher stopped" in str(w.message)]
    finally:
        for w in ws:
            w.close()


def test_a_watcher_that_gives_up_on_the_store_says_so_once():
    ws = _flaky_watchers(failing=-1)
    try:
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            assert wait_for(lambda: not any(w._thread.is_alive() for w in ws), 60)
        stopped = sorted(str(w.message) for w in said if "watcher stopped" in str(w.message))
        assert len(stopped) == 2 and all(w.problem is None for w in ws), stopped
        assert stopped[0].startswith("ddplab.guard: rank 0's watcher stopped after 3 store errors in a row "
                                     "(RuntimeError: store down)"), stopped
        assert stopped[1].startswith("ddplab.guard: rank 1's watcher stopped"), stopped
    finally:
        for w in ws:
            w.close()
