"""What a balance study measured (`BalanceStudy`, `rank/tasks/balance.py`), as tables.

- `balance_calibration(run)`: every calibration point with what the cost model (c + a x tokens +
  b x sum_sq) and the tokens-only model (c + a x tokens) predict for it, and their errors;
- `balance_fit(run)`: the two models side by side: coefficients, R^2, mean and max |error|, and the
  quadratic term's standard error (`judge_quadratic_term`: is it above 0?);
- `balance_assignment(run)`: per policy and rank, the sequences, tokens, sum of squared lengths,
  the cost model's estimate and the check step's reduced-gradient difference from the first policy;
- `balance_timing(run)`: per policy and rank, median compute and wait, and the step (timed by its
  slowest rank), each with its run-to-run spread;
- `balance_verdict(run)`: does cost balancing shorten the longest wait of any rank, and the step?
  Judged by `claims` on the paired steps (each round runs both policies, in alternating order);
- `imbalance(run)`, `verify_cost_explains_imbalance`: out of sample, does the cost model predict the
  measured gap between the slowest and fastest rank better than the token count?
The spread is `stats.round_summary`'s: 1.4826 x the MAD of the per-round medians, and at least what
step-to-step noise implies for a median of one round's steps. Numbers in, DataFrames out (no
processes). Used by notebook 07.
"""

from __future__ import annotations

import pandas as pd

from .. import predict
from .stats import round_summary
from .reads import reading, reading_no_run



@reading(run="balance-study")
def balance_record(run, rank: int = 0):
    """What `rank` recorded (`record.BalanceRecord`)."""
    if run.spec.task.kind != "balance-study":
        raise ValueError(f"this run is a {run.spec.task.kind} run, not a balance study: run a BalanceStudy task")
    return run.ranks[rank].result


def _records(run) -> list:
    balance_record(run)
    return [r.result for r in run.ranks]


def _samples(rec) -> list[tuple[int, int, float]]:
    return [(p.tokens, p.sum_sq, p.median_ms) for p in rec.calibration]


@reading(run="balance-study")
def fitted_models(run) -> dict[str, predict.balance.CostModel]:
    """{"cost": c + a x tokens + b x sum_sq, "tokens": c + a x tokens}, fitted to the calibration
    points (the cost model is the one the ranks fitted and assigned with)."""
    samples = _samples(balance_record(run))
    return {"cost": predict.balance.fit(samples), "tokens": predict.balance.fit_tokens(samples)}


@reading(run="balance-study")
def balance_calibration(run) -> pd.DataFrame:
    """One row per calibration point: its shape, the rank that timed it, its median and range (ms),
    and each model's prediction and error (predicted - measured)."""
    rec, fitted = balance_record(run), fitted_models(run)
    rows = []
    for p in rec.calibration:
        row = {"count": p.count, "length": p.length, "tokens": p.tokens, "sum_sq": p.sum_sq, "rank": p.rank,
               "measured_ms": p.median_ms, "min_ms": min(p.ms), "max_ms": max(p.ms)}
        for name, m in fitted.items():
            row[f"{name}_model_ms"] = m.predict(p.tokens, p.sum_sq)
            row[f"{name}_error_ms"] = row[f"{name}_model_ms"] - p.median_ms
        rows.append(row)
    return pd.DataFrame(rows)


@reading(run="balance-study")
def balance_fit(run) -> pd.DataFrame:
    """One row per model ("cost", "tokens"): its coefficients (the quadratic term with its least-squares
    standard error: NaN for a model without that term), the fit's residual degrees of freedom, and how well it explains the points."""
    samples = _samples(balance_record(run))
    errors, dof = predict.balance.standard_errors(samples)
    rows = []
    for name, m in fitted_models(run).items():
        q = predict.balance.quality(m, samples)
        rows.append({"model": name, "formula": "c + a*tokens + b*sum_sq" if name == "cost" else "c + a*tokens",
                     "c_ms": m.c_ms, "a_ms_per_token": m.a_ms_per_token, "b_ms_per_sq": m.b_ms_per_sq,
                     "b_se_ms_per_sq": errors.b_ms_per_sq if name == "cost" else float("nan"),   # no b term
                     "dof": dof if name == "cost" else dof + 1, "r2": q.r2,
                     "mean_abs_error_ms": q.mean_abs_error_ms, "max_abs_error_ms": q.max_abs_error_ms,
                     "mean_rel_error": q.mean_rel_error})
    return pd.DataFrame(rows).set_index("model")


def _t_over_z(dof: int, alpha: float) -> float:
    """Student's t quantile over the normal one at 1 - alpha with `dof` degrees of freedom (Cornish-Fisher,
    Abramowitz & Stegun 26.7.5: within 1% from 5 degrees of freedom at alpha 0.001). `claims.estimate`
    takes a normal interval; a standard error scaled by this gives the t interval of a fit to few points."""
    from statistics import NormalDist

    z = NormalDist().inv_cdf(1 - alpha)
    g = [(z ** 3 + z) / 4, (5 * z ** 5 + 16 * z ** 3 + 3 * z) / 96,
         (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / 384,
         (79 * z ** 9 + 776 * z ** 7 + 1482 * z ** 5 - 1920 * z ** 3 - 945 * z) / 92160]
    return (z + sum(gi / dof ** (i + 1) for i, gi in enumerate(g))) / z


@reading(run="balance-study")
def judge_quadratic_term(run):
    """The claim "the fitted quadratic term is positive" (longer sequences cost more per token), judged
    by `claims.estimate` on b and its least-squares standard error, widened to Student's t for the fit's
    few degrees of freedom."""
    from .. import claims

    row = balance_fit(run).loc["cost"]
    dof = int(row["dof"])
    return claims.estimate("quadratic term > 0: a token costs more in a longer sequence (the fitted b, ms per "
                           "squared token)", row["b_ms_per_sq"], row["b_se_ms_per_sq"], above=0.0,
                           widen=(_t_over_z(dof, claims.ALPHA), f"; the interval Student's t for {dof} degrees of freedom"))


@reading(run="balance-study")
def balance_assignment(run) -> pd.DataFrame:
    """One row per (policy, rank): what it computes every step and what the cost model expects."""
    rows = []
    for rank, rec in enumerate(_records(run)):
        for a in rec.arms:
            rows.append({"policy": a.policy, "rank": rank, "sequences": predict.balance.describe(a.lengths),
                         "count": len(a.lengths), "tokens": a.tokens, "sum_sq": a.sum_sq,
                         "predicted_ms": a.predicted_ms, "grad_rel_diff": a.grad_rel_diff})
    return pd.DataFrame(rows).set_index(["policy", "rank"]).sort_index()


def _rounds(steps, value) -> dict[int, list[float]]:
    """Per round, `value(step)` of every step in it."""
    out: dict[int, list[float]] = {}
    for s in steps:
        out.setdefault(s.round, []).append(value(s))
    return out


def _per_step(records, policy: str) -> list[list]:
    """Per timed step of `policy`, every rank's record of it (`record.BalanceStep`)."""
    return [list(s) for s in zip(*(rec.arm(policy).steps for rec in records))]


def _slowest(records, policy: str, value) -> dict[int, list[float]]:
    """Per round, the largest `value` over the ranks of each step."""
    out: dict[int, list[float]] = {}
    for s in _per_step(records, policy):
        out.setdefault(s[0].round, []).append(max(value(x) for x in s))
    return out


@reading(run="balance-study")
def balance_timing(run) -> pd.DataFrame:
    """One row per (policy, rank): median compute_ms and wait_ms with their spreads, the cost model's
    predicted compute, and (the same on every row of a policy) the step, timed by its slowest rank
    from the common start to the all-reduce's return, and the longest wait of any rank."""
    records = _records(run)
    rows = []
    for policy in [a.policy for a in records[0].arms]:
        step_ms, step_spread = round_summary(_slowest(records, policy, lambda x: x.step_ms))
        wait_ms, wait_spread = round_summary(_slowest(records, policy, lambda x: x.wait_ms))
        for rank, rec in enumerate(records):
            arm = rec.arm(policy)
            compute, compute_spread = round_summary(_rounds(arm.steps, lambda x: x.compute_ms))
            wait, spread = round_summary(_rounds(arm.steps, lambda x: x.wait_ms))
            rows.append({"policy": policy, "rank": rank, "tokens": arm.tokens, "sum_sq": arm.sum_sq,
                         "predicted_ms": arm.predicted_ms, "compute_ms": compute, "compute_spread_ms": compute_spread,
                         "wait_ms": wait, "wait_spread_ms": spread, "step_ms": step_ms, "step_spread_ms": step_spread,
                         "max_wait_ms": wait_ms, "max_wait_spread_ms": wait_spread})
    return pd.DataFrame(rows).set_index(["policy", "rank"]).sort_index()


@reading(run="balance-study")
def paired_steps(run, value) -> dict[str, list[float]]:
    """Per policy, `value` of every timed step at its slowest rank, in step order. Step j of one policy
    and step j of another ran in the same round, one after the other (the order alternates by round):
    the pairs a claim about the two policies is judged on."""
    records = _records(run)
    return {a.policy: [max(value(x) for x in s) for s in _per_step(records, a.policy)] for a in records[0].arms}


@reading(run="balance-study")
def balance_verdict(run) -> dict:
    """Cost balancing against equal tokens, judged by `claims` on the paired steps: {"max_wait_ms":
    balancing by cost shortens the longest wait of any rank, "step_ms": it shortens the step}."""
    from .. import claims

    policies = {a.policy for a in _records(run)[0].arms}
    if not {"tokens", "cost"} <= policies:
        raise ValueError(f"a verdict needs both policies, tokens and cost (this study ran {sorted(policies)})")
    out = {}
    for key, what, value in (("max_wait_ms", "the longest wait of any rank", lambda x: x.wait_ms),
                             ("step_ms", "the step (at its slowest rank)", lambda x: x.step_ms)):
        arms = paired_steps(run, value)
        out[key] = claims.paired(f"balancing by cost shortens {what} (balanced by cost minus equal tokens, per "
                                 "step of the same round)", arms["cost"], arms["tokens"], below=0.0)
    return out


@reading_no_run
def step_finding(verdict) -> str:
    """The step's verdict of `balance_verdict` as this run's finding, in words (not a check: whether
    balancing by cost also shortens the step depends on what else the cores do)."""
    what = {"holds": "shorter", "contradicted": "longer"}.get(verdict.outcome, "not resolved against equal tokens")
    return f"this run's step, balanced by cost: {what} (seen {verdict.effect()} a step)"


@reading(run="balance-study")
def imbalance(run) -> pd.DataFrame:
    """Per policy, out of sample: the gap between its slowest and fastest rank's median compute as
    measured in the study's steps (and `step_gaps_ms`, that gap in each step: both ranks computed
    it at once, so the pairs share the machine's load), and the gap each fitted model predicts between the same two ranks
    from their sequences (`cost`: c + a x tokens + b x sum_sq; `tokens`: c + a x tokens, which sees
    no gap between ranks of equal tokens)."""
    models, timing = fitted_models(run), balance_timing(run)
    rows = []
    for policy in dict.fromkeys(timing.index.get_level_values("policy")):
        compute = timing.loc[policy, "compute_ms"]
        slow, fast = compute.idxmax(), compute.idxmin()
        lengths = {r: rec.arm(policy).lengths for r, rec in enumerate(_records(run))}
        gap = {name: m.lengths_ms(lengths[slow]) - m.lengths_ms(lengths[fast]) for name, m in models.items()}
        records = _records(run)
        step_gaps = [a.compute_ms - b.compute_ms for a, b in zip(records[slow].arm(policy).steps,
                                                                 records[fast].arm(policy).steps)]
        rows.append({"policy": policy, "slow_rank": slow, "fast_rank": fast,
                     "measured_gap_ms": compute[slow] - compute[fast], "step_gaps_ms": step_gaps,
                     "cost_model_gap_ms": gap["cost"], "tokens_model_gap_ms": gap["tokens"]})
    return pd.DataFrame(rows).set_index("policy")


@reading_no_run
def verify_cost_explains_imbalance(table: pd.DataFrame, policy: str = "tokens", share: float = 0.25) -> None:
    """Notebook 07's check, on an `imbalance` table: for `policy`'s split, the ranks of equal tokens
    differ in compute the way the cost model predicts, in its direction and by at least `share` of
    the predicted gap, while the token count predicts no gap at all. Out of sample: the models were
    fitted on calibration shapes timed alone, at another moment. One-sided on purpose: inside a real
    step both ranks compute at once and share the machine, which stretches or shrinks the gap by a
    share that load decides (the ratio is printed; it is not a constant of the model). Judged by
    `claims` on the per-step ratios measured / predicted (above `share`); raises `verify.CheckFailed`
    when the steps contradict it, or when the cost model predicts no gap (tests/tasks/test_balance.py feeds
    it ranks that took the same time)."""
    from .. import claims, verify

    row = table.loc[policy]
    name = (f"{policy} split: the rank gap is at least {share:g} of the cost model's gap (ranks "
            f"{int(row['slow_rank'])} and {int(row['fast_rank'])}: {row['measured_gap_ms']:.1f} ms, median; the cost "
            f"model {row['cost_model_gap_ms']:.1f} ms, the token count {row['tokens_model_gap_ms']:.1f} ms; "
            "measured over predicted, per step)")
    predicted = row["cost_model_gap_ms"]
    if not predicted > 0:
        raise verify.CheckFailed(f"NOT verified: {name}: the cost model predicts no gap ({predicted:.3g} ms)")
    claims.check(claims.judge(name, [g / predicted for g in row["step_gaps_ms"]], above=share, unit="x"))
