"""Fault injection, to study failures: which rank misbehaves, how, and in which step (pure).

    Experiment(world_size=2, steps=2, fault=Fault("skip-backward", rank=1, step=1), timeout_s=5)

- "crash": the rank raises in the middle of its step; its peers lose it;
- "skip-backward": the rank skips its synchronized backward and goes on to a barrier, while its peers
  wait in the gradient all-reduce (a mismatched collective: a hang until the process-group timeout);
- "stall": the rank stops (it sleeps) before its backward, outside any collective;
- "extra-all-reduce": the rank issues one all-reduce of its own (one number) before its backward,
  which no other rank issues: its peers' first gradient bucket pairs with it (collective order);
- "shape-mismatch": the rank builds its model with one more token in the vocabulary, so its
  embedding and head have other shapes than its peers' (DDP's construction compares them);
- "unused-parameter": the rank's forward bypasses the last block's MLP in that step, so those
  parameters get no gradient there (DDP's own error at the next forward, unless
  find_unused_parameters=True, which then reduces zeros in their place);
- "sigkill": the rank's process is killed with SIGKILL in the middle of its step (as the kernel's
  out-of-memory killer or a scheduler would): no Python code of it runs again.
Only the train task injects faults. Used by notebooks 00 and 08 and `ddplab run --fault`.
"""

from __future__ import annotations

from dataclasses import dataclass

from .checks import bad, is_int

FAULT_KINDS = ("crash", "skip-backward", "stall", "extra-all-reduce", "shape-mismatch", "unused-parameter", "sigkill")
# faults that only mean something between synchronized ranks
NEEDS_PEERS = ("skip-backward", "extra-all-reduce", "shape-mismatch", "unused-parameter")


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int | None = None      # None = the last rank
    step: int = 0

    def check(self, exp) -> None:
        if self.kind not in FAULT_KINDS:
            bad("fault.kind", f"must be one of {', '.join(FAULT_KINDS)} (got {self.kind!r})")
        if not is_int(self.rank) or not 0 <= self.rank < exp.world_size:
            bad("fault.rank", f"must be a rank in 0..{exp.world_size - 1} (got {self.rank!r})")
        if not is_int(self.step) or not 0 <= self.step < exp.steps:
            bad("fault.step", f"must be a step in 0..{exp.steps - 1} (got {self.step!r})")
        if self.kind in NEEDS_PEERS and exp.world_size < 2:
            bad("fault", f"'{self.kind}' needs world_size >= 2: with one rank no peer disagrees with it")
        if self.kind in NEEDS_PEERS and exp.sync != "ddp":
            bad("fault", f"'{self.kind}' needs sync='ddp': without synchronization no peer waits for it")
        if self.kind == "unused-parameter":
            if exp.model != "transformer":
                bad("fault", "'unused-parameter' bypasses a block's MLP: it needs model='transformer'")
            if not 0 <= self.step < exp.steps - 1:
                bad("fault.step", f"'unused-parameter' shows at the forward after the faulty step: the step must be "
                                  f"in 0..{exp.steps - 2}, before the last (got {self.step!r}, steps={exp.steps})")
        if self.kind == "shape-mismatch" and self.rank == 0:
            bad("fault.rank", "'shape-mismatch' must be on a rank other than 0: DDP checks every rank's parameter shapes "
                              "against rank 0's, and the ranks that differ from rank 0 are the ones that raise")
        if self.kind == "shape-mismatch" and self.step != 0:
            bad("fault.step", "'shape-mismatch' happens when the model is built, before step 0: leave step at 0")

    def hits(self, rank: int, step: int) -> bool:
        return rank == self.rank and step == self.step

    @staticmethod
    def from_dict(d) -> "Fault | None":
        if d is None or isinstance(d, Fault):
            return d
        if isinstance(d, str):
            return Fault(d)
        if not isinstance(d, dict) or set(d) - {"kind", "rank", "step"} or "kind" not in d:
            bad("fault", f"must be Fault(kind, rank, step) or None (got {d!r})")
        return Fault(**d)
