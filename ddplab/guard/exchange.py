"""How the ranks of one data-parallel group swap their reports: through the rendezvous key-value store
(torchrun's TCPStore), never through a collective, so a rank that stops stepping cannot hang the others.

Check n: every rank writes `n/<its index in the group>` and waits for every other's key, at most
`timeout_s`. A rank that times out names the ranks whose keys are missing and writes that verdict once
for the group (`n/abort`, by compare-and-set, so every rank gets the same words); a rank that arrives
after the others gave up finds the verdict after its own wait and raises it too. Each rank deletes its
key of check n-1 once every rank has posted check n (so all of them have read n-1).
"""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta

import torch.distributed as dist

from . import checks


class RankMissing(Exception):
    """A check that some rank never reached; `problem` says which and why."""

    def __init__(self, problem: checks.Problem):
        self.problem = problem
        super().__init__(str(problem))


class Exchange:
    def __init__(self, ranks: list[int], serial: int, timeout_s: float):
        from torch.distributed.distributed_c10d import _get_default_store

        self.ranks, self.timeout_s = list(ranks), float(timeout_s)
        self.index = self.ranks.index(dist.get_rank())
        group = hashlib.sha1(repr(self.ranks).encode()).hexdigest()[:12]
        self.store = dist.PrefixStore(f"ddplab-guard/{serial}/{group}/", _get_default_store())
        self.count = 0

    def swap(self, report: dict, step: int) -> list[dict]:
        """Every rank's report for this check, in group order; RankMissing if some rank is missing."""
        n = self.count
        keys = [f"{n}/{i}" for i in range(len(self.ranks))]
        abort = f"{n}/abort"
        self.store.set(keys[self.index], json.dumps(report))
        try:
            self.store.wait(keys, timedelta(seconds=self.timeout_s))
        except (RuntimeError, dist.DistStoreError):
            missing = [r for r, k in zip(self.ranks, keys) if not self.store.check([k])]
            verdict = json.dumps({"missing": missing, "step": step, "text": self._missing_text(missing, step)})
            raise RankMissing(self._problem(self.store.compare_set(abort, "", verdict))) from None
        if self.store.check([abort]):   # the others gave up on this check before this rank arrived
            raise RankMissing(self._problem(self.store.get(abort)))
        reports = [json.loads(self.store.get(k)) for k in keys]
        if n:
            self.store.delete_key(f"{n - 1}/{self.index}")
        self.count += 1
        return reports

    def _missing_text(self, missing: list[int], step: int) -> str:
        if not missing:   # they arrived between the timeout and the look
            return (f"some rank reached the guard's check only after the others had waited {self.timeout_s:g} s: "
                    "the ranks are not stepping together")
        waited = [r for r in self.ranks if r not in missing]
        return (f"{checks.ranks_text(missing)} did not reach the guard's check within {self.timeout_s:g} s while "
                f"{checks.ranks_text(waited)} waited: {'it' if len(missing) == 1 else 'they'} stopped taking "
                "optimizer steps (left the loop early with fewer batches than the others, as under DDP's join(); "
                f"or stuck in its own code); {checks.ALONE_HINT}")

    @staticmethod
    def _problem(raw) -> checks.Problem:
        verdict = json.loads(raw)
        return checks.Problem("rank-missing", verdict["step"], tuple(verdict["missing"]), verdict["text"])
