"""`Watcher`: a thread in each rank that names a rank which stopped stepping, without waiting for the
training step to reach the guard's optimizer hook.

A rank that stops between two steps leaves the others inside a collective of the next one (DDP's buffer
broadcast in forward, its gradient all-reduce at the end of backward), and a thread inside a collective
never reaches the hook where the ranks swap reports (`exchange.py`). So each rank's hooks keep its
position, (optimizer steps taken, training forwards of this step, whether backward has begun since the
last forward), and the watcher posts it to the store when it changes (`beat/<index>`) and reads every
other rank's, every `period_s` (a tenth of `timeout_s`, at most 5 s). A rank whose own position has not
moved for `timeout_s` while another's sits behind it, as long unchanged, is waiting for that rank: its
watcher writes one verdict for the group (`stall`, by compare-and-set, so every rank has the same words).
Ranks at the same position never trigger it (they are in the same collective, or the exchange is waiting
for them), nor does a rank that keeps stepping while another has left the loop (DDP's join()).

Then each waiting rank prints the verdict on stderr. It cannot raise it: its main thread is inside a gloo
collective, which Python cannot interrupt and ProcessGroupGloo.abort() does not release (torch 2.13.0
and 2.14.1). With on_problem="raise" the waiting rank then ends its own process (exit code 1, after
flushing its output), as torch's NCCL watchdog does on a collective timeout, so torchrun stops the job now
rather than after the process group's own timeout (30 minutes by default); with "warn" it keeps waiting.
The rank that stopped raises the same words as a GuardError at its next forward or optimizer step
("raise"), or prints them ("warn"). The watcher shares the rendezvous store's connection with the
exchange, so while the exchange waits for reports (and names a missing rank itself) the watcher waits too.

A rank that works alone between steps for longer than `timeout_s` (`if rank == 0: evaluate()`, a long
torch.save) looks the same from outside: the others wait in the next step's collective, and they are
ended too (as the next check would end them). The verdict says to raise `timeout_s` above that time.
A store error is retried (STORE_TRIES looks in a row); after that the watcher stops and says so once on
its rank, as a RuntimeWarning (the next check still names a missing rank).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import warnings

from . import checks

EXIT_CODE = 1
STORE_TRIES = 3   # store errors in a row before the watcher gives up, and says so


class Watcher:
    def __init__(self, guard, store, ranks: list[int], index: int, timeout_s: float):
        self.guard, self.store, self.ranks, self.index = guard, store, list(ranks), index
        self.timeout_s = float(timeout_s)
        self.period_s = min(5.0, self.timeout_s / 10)   # a verdict comes at most a tenth of timeout_s late
        self.problem: checks.Problem | None = None   # the group's verdict, once this rank has read it
        self._posted = None
        self._seen: dict[int, tuple] = {}   # index -> (position, monotonic time it was first seen there)
        self._lock, self._stop = threading.Lock(), threading.Event()
        self._post(guard.position)   # before the thread starts: every rank that attached has a position
        self._thread = threading.Thread(target=self._run, name="ddplab-guard-watcher", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=self.period_s + 2)

    def verdict(self) -> checks.Problem | None:
        """The group's verdict, read from the store now (the main thread calls it after a long pause)."""
        if self.problem is None and self.store.check(["stall"]):
            self._adopt(self.store.get("stall").decode())
        return self.problem

    def _post(self, position: tuple) -> None:
        if position != self._posted:
            self.store.set(f"beat/{self.index}", json.dumps(position))
            self._posted = position

    def _run(self) -> None:
        errors = 0
        while not self._stop.wait(self.period_s):
            if self.guard.stopped and self.problem is None:
                return   # the guard stopped for another reason (a check some rank never reached)
            try:
                raw = self._look()
            except Exception as e:  # noqa: BLE001 - a passing store error, or the store is gone (the job ends)
                errors += 1
                if errors < STORE_TRIES:
                    continue
                if not self._stop.is_set():
                    warnings.warn(f"ddplab.guard: rank {self.guard.rank}'s watcher stopped after {errors} store errors "
                                  f"in a row ({type(e).__name__}: {e}); a rank that stops stepping is named only at "
                                  "the guard's next check", RuntimeWarning, stacklevel=1)
                return
            errors = 0
            if raw is not None:
                self._adopt(raw)
                if self._blocked() and self.guard.rank not in self.problem.ranks:
                    self._end()
                return

    def _look(self) -> str | None:
        """The group's verdict, if there is one now (this rank's, if it finds a rank it waits for)."""
        now, mine = time.monotonic(), tuple(self.guard.position)
        self._post(mine)
        keys = [f"beat/{i}" for i in range(len(self.ranks))]
        if self.store.check(keys):   # two calls to the store, however many ranks
            raws = self.store.multi_get(keys)
        else:   # a rank that has not attached its guard yet: not begun
            raws = [self.store.get(k) if self.store.check([k]) else b"[0, 0, 0]" for k in keys]
        for i, raw in enumerate(raws):
            position = tuple(json.loads(raw))
            if self._seen.get(i, (None,))[0] != position:
                self._seen[i] = (position, now)
        if self.store.check(["stall"]):
            return self.store.get("stall").decode()
        if not self._blocked():
            return None
        behind = [i for i, (position, since) in self._seen.items()
                  if position < mine and now - since >= self.timeout_s]
        if not behind:
            return None
        waiting = [self.ranks[i] for i, (position, _) in self._seen.items() if position >= mine]
        text = self._text([self.ranks[i] for i in behind], [self._seen[i][0] for i in behind], waiting, mine)
        verdict = json.dumps({"missing": [self.ranks[i] for i in behind], "step": mine[0], "text": text})
        return self.store.compare_set("stall", "", verdict).decode()

    def _blocked(self) -> bool:
        """Has this rank's own position stayed put for timeout_s (it waits inside a step)?"""
        position, since = self._seen.get(self.index, (None, time.monotonic()))
        return position == tuple(self.guard.position) and time.monotonic() - since >= self.timeout_s

    def _text(self, missing: list[int], positions: list[tuple], waiting: list[int], mine: tuple) -> str:
        where = "; ".join(f"rank {r} {_where(p)}" for r, p in zip(missing, positions))
        one = len(missing) == 1
        return (f"{checks.ranks_text(missing)} stopped stepping: {where}, unchanged for over {self.timeout_s:g} s, "
                f"while {checks.ranks_text(waiting)} waited in step {mine[0]} (inside its forward or backward, where "
                f"DDP's collectives need every rank). {'It' if one else 'They'} left the training loop early (fewer "
                "batches than the others; DDP's join() lets such a rank shadow the others' collectives) or "
                f"{'is' if one else 'are'} stuck in {'its' if one else 'their'} own code (a sleep, a lock, I/O, "
                f"a collective only some ranks call); {checks.ALONE_HINT}.")

    def _adopt(self, raw: str) -> None:
        """Record the verdict once (from either thread); in warn mode, say it."""
        with self._lock:
            if self.problem is not None:
                return
            verdict = json.loads(raw)
            self.problem = checks.Problem("rank-stopped", verdict["step"], tuple(verdict["missing"]), verdict["text"])
            self.guard.problems.append(self.problem)
            self.guard.stopped = True
        if self.guard.on_problem == "warn":
            print(f"{self.problem} The guard stops checking.", file=sys.stderr, flush=True)

    def _end(self) -> None:
        """This rank waits inside a collective for a rank that stopped: say so and, in raise mode, end it."""
        if self.guard.on_problem == "warn":
            return
        print(f"{self.problem}\nddplab.guard ends rank {self.guard.rank} (exit code {EXIT_CODE}): it waits inside a "
              "collective, which cannot be interrupted, and on_problem='raise' stops the run.",
              file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(EXIT_CODE)


def _where(position: tuple) -> str:
    step, forwards, backward = position
    if not forwards:
        return f"has not begun step {step}"
    return f"is in step {step}, {'after' if backward else 'before'} its backward"
