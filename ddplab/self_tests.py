"""The chapters' self-tests: a learner writes an answer to one knowledge-check question in a cell,

    my_answer_gb = None   # your answer to question 1
    self_tests.check("02.1", my_answer_gb, spec=main)

and the lab says "not answered yet", "correct", or "not quite" (too high, too low, or which entries differ)
with a hint.
The expected value is computed here, by the lab's own models (or from a count the notebook measured and
passes in), so the learner's cell never shows it. `QUESTIONS[key].guide` is the answer the chapter's
folded answer guide gives: `tests/notebooks/test_self_tests.py` checks that each guide's answer equals
what the lab computes and appears in the notebook's answer guide, and that no self-test cell shows it.

A learner's answer never fails the notebook: `check` returns True, False, or None (unanswered). Pure: no
torch, no pandas.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from .predict import balance, buckets, comm, compression, loss_weights, memory, pipeline, zero
from .spec import Experiment, sharding
from .verify import CheckFailed, fmt, listed

__all__ = ["QUESTIONS", "Question", "check", "expected"]

MIB = 1 << 20


@dataclass(frozen=True)
class Question:
    """One self-test: the question as the learner reads it, how the lab computes its answer (from the
    lab's models and the values the cell passes), the answer guide's answer (and the words that give it
    there), and a hint for a wrong try."""
    text: str
    compute: Callable[..., object]
    guide: object
    phrase: str   # the words of the chapter's answer guide that give `guide` (a test finds them there)
    hint: str = ""
    needs: tuple[str, ...] = field(default=())   # the values the notebook's cell passes in
    rel_tol: float = 1e-6   # how close an answer must be: wider where the guide's answer has many digits


def _bytes_per_parameter(spec: Experiment) -> int:
    state = memory.state_bytes(spec.replace(world_size=8))
    return round(sum(state.values()) / sum(memory.parameter_numels(spec)))


def _half_mib_grads() -> list:
    return [buckets.Grad(f"g{i}", MIB // 2, float(i)) for i in range(8)]


def _per_example_weight_ratio() -> float:
    w = loss_weights.rank_weights([4, 12], [16, 16], "rank-mean")
    return round((w[0] / 4) / (w[1] / 12), 9)


QUESTIONS: dict[str, Question] = {
    "00.5": Question(
        "question 5: the sample ids of rank 2 in step 1",
        lambda: sharding.shard_ids([4, 2, 6], accum_steps=1, step=1, micro=0, rank=2),
        guide=list(range(18, 24)), phrase="Ids 18 to 23",
        hint="step 1 starts after step 0's 4 + 2 + 6 ids; ranks 0 and 1 come first"),
    "01.1": Question(
        "question 1: the per-example weight, first rank over second",
        _per_example_weight_ratio, guide=3, phrase="a factor of 3",
        hint="each rank's mean counts 1/2; an example's share is that divided by its rank's examples"),
    "02.1": Question(
        "question 1: model state per rank, 1 B parameters, Adam, float32, 8 ranks (GB)",
        _bytes_per_parameter, guide=20, phrase="20 GB on *every* rank", needs=("spec",),
        hint="add 4 bytes per parameter for each of parameters, gradients, buckets, and 8 for Adam's two moments"),
    "03.1": Question(
        "question 1: bytes each rank sends per step: 7 B parameters, bf16 gradients, ring all-reduce on 8 ranks (GB)",
        lambda: comm.ring_bytes_per_rank(comm.payload_bytes(7_000_000_000, 2), 8) / 1e9, guide=24.5,
        phrase="= 24.5 GB",
        hint="the payload G is 2 bytes per parameter; each rank sends 2(D-1)/D x G"),
    "04.3": Question(
        "question 3: communication's cost to the step: 112 ms with DDP, 100 ms without, four all-reduces "
        "in flight 30 ms each (ms)",
        lambda: 112 - 100, guide=12, phrase="12 ms (112 - 100)",
        hint="the bars' sum, 120 ms, overlapped with backward and with each other; compare the two steps"),
    "05.3": Question(
        "question 3: sixteen 1 MiB buckets, alpha 0.5 ms, 2 ms per MiB (total ms)",
        lambda: round(16 * comm.AlphaBeta(alpha_s=0.5e-3, beta_s_per_byte=2e-3 / MIB).predict(MIB) * 1e3, 9),
        guide=40, phrase="= 40 ms", hint="each bucket costs alpha + its MiB x 2 ms; add the sixteen"),
    "06.1": Question(
        "question 1: [global batch, all-reduces per bucket per optimizer step]",
        lambda all_reduces_per_step, buckets: [Experiment(world_size=8, local_batch=4, accum_steps=16).global_batch,
                                              all_reduces_per_step / buckets],
        guide=[512, 1], phrase="= 512 examples; one all-reduce per bucket", needs=("all_reduces_per_step", "buckets"),
        hint="multiply the three factors; with no_sync only the last micro-step's backward all-reduces"),
    "07.3": Question(
        "question 3: eight 512-token sequences, t = 2 + 0.01 x tokens + 0.0001 x sum of squares (ms)",
        lambda: round(balance.CostModel(c_ms=2.0, a_ms_per_token=0.01, b_ms_per_sq=0.0001)
                      .predict(8 * 512, 8 * 512 ** 2), 9),
        guide=252.6752, phrase="= 252.6752 ms", hint="tokens = 8 x 512; the sum of squared lengths = 8 x 512 x 512",
        rel_tol=1e-4),   # 252.68, the guide's answer to two decimals, is right
    "08.1": Question(
        "question 1: 10 examples on 4 ranks, drop_last=False: examples seen twice",
        lambda: -(-10 // 4) * 4 - 10, guide=2, phrase="2 examples are seen twice",
        hint="each rank gets ceil(N/W); the extra ones are repeats"),
    "09.1": Question(
        "question 1: 13 B parameters, 32 GPUs, ZeRO stage 2: GB per GPU (one decimal)",
        lambda: round(zero.zero_state_bytes(13e9, 32, 2)["total"] / 1e9, 1), guide=31.7, phrase="\\approx 31.7",
        hint="2 bytes of parameters stay whole; gradients and the 12 bytes of state are divided by N"),
    "09.4a": Question(
        "question 4: 4 stages, 12 microbatches: bubble fraction",
        lambda: pipeline.bubble_fraction(4, 12), guide=0.2, phrase="= 0.2", hint="(p - 1) / (m + p - 1)"),
    "10.1": Question(
        "question 1: a 1024 x 4096 matrix under PowerSGD at rank 4: floats in P and Q together",
        lambda: compression.payload_bytes("powersgd", [[1024, 4096]], step=10, psgd=compression.PowerSGD(rank=4)) // 4,
        guide=20480, phrase="= 20480$ floats", hint="P is n x r and Q is m x r, with n = 1024 rows and m = 4096 columns"),
    "11.1": Question(
        "question 1: eight 0.5 MiB gradients, bucket_cap_mb=2: [DDP's buckets, DDPOptimizer's graphs]",
        lambda: [len(buckets.ddp_plan(_half_mib_grads(), 2 * MIB, 2 * MIB)),
                 len(buckets.ddp_plan(_half_mib_grads(), 2 * MIB, 1 * MIB))],
        guide=[2, 3], phrase="= [2, 3]",
        hint="DDP's first bucket takes the cap you set; DDPOptimizer's first bucket closes at 1 MiB whatever the cap"),
    "12.1": Question(
        "question 1: 7e9 parameters, AdamW in float32, FSDP2 over 64 ranks: GB (1e9 bytes) of model state per rank",
        lambda: round(zero.zero_state_bytes(7e9, 64, 3, "fp32")["total"] / 1e9, 2), guide=1.75, phrase="= 1.75",
        hint="4 bytes of parameters, 4 of gradients and 8 of AdamW's two moments per parameter, all divided by the ranks"),
    "09.4b": Question(
        "question 4: 4 stages, 12 microbatches, 1F1B: microbatches in flight on stage 0",
        lambda: pipeline.in_flight("1F1B", 4, 12, 0), guide=4, phrase="= 4$", hint="min(m, p - stage)"),
}


def _question(key: str) -> Question:
    if key not in QUESTIONS:
        raise ValueError(f"self_tests: no question {key!r}; the questions are {', '.join(QUESTIONS)}")
    return QUESTIONS[key]


def expected(key: str, **values) -> object:
    """What the lab computes for question `key` (the cell's measured `values` passed in); raises
    CheckFailed when the chapter's answer guide says something else (that is what CI checks, since a
    learner's cell starts unanswered)."""
    q = _question(key)
    missing = sorted(set(q.needs) - set(values))
    unknown = sorted(set(values) - set(q.needs))
    if missing or unknown:
        raise ValueError(f"self_tests.check({key!r}): pass {', '.join(q.needs) or 'no values'}"
                         + (f"; missing {', '.join(missing)}" if missing else "")
                         + (f"; unknown {', '.join(unknown)}" if unknown else ""))
    value = listed(q.compute(**values))
    if not _same(value, listed(q.guide)):
        raise CheckFailed(f"NOT verified: {q.text}: the answer guide says {fmt(q.guide)}, the lab computes "
                          f"{fmt(value)}")
    return value


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _same(a, b, rel_tol: float = 1e-6) -> bool:
    if _number(a) and _number(b):
        return math.isclose(a, b, rel_tol=rel_tol, abs_tol=1e-12)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y, rel_tol) for x, y in zip(a, b))
    return a == b


def _how_far(answer, value, rel_tol: float = 1e-6) -> str:
    """Where a wrong answer is against the lab's, without saying the lab's value or the distance to it."""
    if _number(answer) and _number(value):   # the side only: a gap would give the answer away
        return "too high" if answer > value else "too low"
    if isinstance(answer, list) and isinstance(value, list):
        if len(answer) != len(value):
            return f"{len(answer)} entries where {len(value)} are due"
        wrong = [i + 1 for i, (x, y) in enumerate(zip(answer, value)) if not _same(x, y, rel_tol)]
        return (f"entry {wrong[0]} of {len(value)} differs" if len(wrong) == 1
                else f"entries {', '.join(map(str, wrong))} of {len(value)} differ")
    return f"a {type(answer).__name__} where a {type(value).__name__} is due"


def check(key: str, answer, **values) -> bool | None:
    """The learner's `answer` to question `key`: prints "not answered yet", "correct", or "not quite"
    (which side, and the hint), and returns None, True or False; never fails the notebook for the
    learner's answer."""
    q = _question(key)
    value = expected(key, **values)
    if answer is None:
        print(f"not answered yet: {q.text} (replace None with your answer and run the cell again)")
        return None
    answer = listed(answer)
    if _same(answer, value, q.rel_tol):
        print(f"correct: {q.text}: {fmt(answer)}")
        return True
    print(f"not quite: {q.text}: you answered {fmt(answer)}, {_how_far(answer, value, q.rel_tol)}"
          + (f"; hint: {q.hint}" if q.hint else ""))
    return False
