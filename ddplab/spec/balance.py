"""The balance study's settings (notebook 07). Its record: `record/balance.py`; its rank:
`rank/tasks/balance.py`."""

from __future__ import annotations

from dataclasses import dataclass

from ..predict.balance import POLICIES as BALANCE_POLICIES
from ..predict.balance import calibration_shapes
from ..record.balance import BalanceRecord
from .checks import bad, is_int
from .tasks import MODEL_FIELDS, RUN_FIELDS, Phase, TaskSpec, register


BALANCE_ALL_REDUCE = "all_reduce of the flattened gradient"


@register
@dataclass(frozen=True, kw_only=True)
class BalanceStudy(TaskSpec):
    """Equal tokens, unequal cost (`rank/tasks/balance.py`, notebook 07): calibrate a cost model of
    forward+backward on this machine, share the sequences of `pool` (their lengths) among the ranks by
    each policy in `policies` ("tokens": equal tokens, one length per rank; "cost": balanced estimated
    cost, `predict/balance.py`), check both reduce the same gradient, then time `steps_per_round`
    steps of each in each of `rounds` rounds, alternating. No optimizer step: the study times compute
    and waiting, and every step starts from the same parameters. Calibration: every length in
    `calibration_lengths` at `calibration_tokens` tokens and at half as many, each timed
    `calibration_repeats` times. `seq_len` must hold the longest sequence (the position embedding)."""

    kind = "balance-study"
    runner = "ddplab.rank.tasks.balance:run"
    record = BalanceRecord
    phases = (Phase("build", 2), Phase("calibrate", 3),
              Phase("share-calibration", 4, "all-gather of the calibration points"),
              Phase("check", 5, BALANCE_ALL_REDUCE), Phase("warm-up", 5, BALANCE_ALL_REDUCE),
              Phase("round", 6, BALANCE_ALL_REDUCE),
              Phase("share-arrivals", 7, "all-gather of the arrival times", after_steps=True))
    reads = RUN_FIELDS | (MODEL_FIELDS - {"local_batch"})
    step_unit = "rounds"
    pool: tuple[int, ...] = ()
    policies: tuple[str, ...] = BALANCE_POLICIES
    calibration_lengths: tuple[int, ...] = (32, 64, 128, 256, 512)
    calibration_tokens: int = 1024
    calibration_repeats: int = 5
    rounds: int = 5
    steps_per_round: int = 3

    def check(self, exp) -> None:
        pool = list(self.pool) if isinstance(self.pool, tuple) else None
        if not pool or not all(is_int(n) and 1 <= n <= 2 ** 16 for n in pool) or sum(pool) > 2 ** 20:
            bad("task.pool", f"needs the sequence lengths of one global batch, integers in 1..65536, at most "
                             f"2**20 tokens in all (got {self.pool!r})")
        if is_int(exp.world_size) and len(pool) < exp.world_size:
            bad("task.pool", f"{len(pool)} sequences cannot give each of world_size={exp.world_size} ranks one")
        policies = list(self.policies) if isinstance(self.policies, tuple) else None
        if not policies or not all(p in BALANCE_POLICIES for p in policies) or len(set(policies)) != len(policies):
            bad("task.policies", f"distinct policies from {', '.join(BALANCE_POLICIES)} (got {self.policies!r})")
        lengths = list(self.calibration_lengths) if isinstance(self.calibration_lengths, tuple) else None
        if not lengths or len(lengths) < 2 or not all(is_int(n) and n >= 1 for n in lengths) or \
                len(set(lengths)) != len(lengths):
            bad("task.calibration_lengths", f"at least 2 distinct positive lengths (got {self.calibration_lengths!r})")
        if max(lengths) < max(pool):
            bad("task.calibration_lengths", f"must reach the longest sequence of the pool ({max(pool)}), so the cost "
                                            f"model is not extrapolated (got up to {max(lengths)})")
        t = self.calibration_tokens
        if not is_int(t) or not 1 <= t <= 2 ** 20 or any(t % (2 * n) for n in lengths):
            bad("task.calibration_tokens", f"must be at most 2**20 and a multiple of twice every calibration length "
                                           f"(it is timed at that many tokens and at half) (got {t!r})")
        for name, top in (("calibration_repeats", 1000), ("rounds", 10 ** 4), ("steps_per_round", 10 ** 4)):
            v = getattr(self, name)
            if not is_int(v) or not 1 <= v <= top:
                bad(f"task.{name}", f"must be an integer in 1..{top} (got {v!r})")
        longest = max(max(pool), max(lengths))
        if not is_int(exp.seq_len) or exp.seq_len < longest:
            bad("seq_len", f"the model's position embedding holds seq_len tokens: set one seq_len of at least "
                           f"{longest}, the longest sequence of the pool and of the calibration (got {exp.seq_len!r})")

    def shapes(self) -> list[tuple[int, int]]:
        """The calibration micro-batches (count, length); rank r times every world_size-th one from r."""
        return calibration_shapes(self.calibration_lengths, self.calibration_tokens)

    def total_steps(self, exp) -> int:
        return self.rounds
