"""Tables of compiled DDP (notebook 11): DDPOptimizer's split against the graphs compiled and against
DDP's own buckets, when gradients become ready eager and compiled, and the step, eager against
compiled, cap by cap. The split is torch's own record (`rank/tasks/compiled_ddp.py`), never re-derived
here; the step is judged by `claims` on the paired steps of one cap."""

from __future__ import annotations

import statistics
from collections import Counter

import pandas as pd

from .. import claims, verify
from .stats import moves, slowest_rank
from .reads import reading, reading_no_run

SAME_TRAINING_REL = 1e-4   # compiled against eager parameters after the same steps: float32 reassociation only
EXACT_BACKENDS = ("aot_eager",)   # AOTAutograd's graphs run by the eager kernels: the same arithmetic, bit for bit,
# on 2 ranks, where the all-reduce adds two numbers (the same bits in either order); on more, the ring adds in
# an order that follows the buckets, which compiling changes


def _arms(run, rank: int = 0) -> dict:
    return {a.name: a for a in run.ranks[rank].result.arms}


def _cap(cap) -> str:
    return "default" if cap is None else f"{cap:g}"


def _arm(run, kind: str, cap):
    """The run's `kind` ("eager" or "compiled") arm at `cap` in torch's default mode; ValueError naming
    `cap` and the arms the run has if it has none."""
    arms = _arms(run)
    name = f"{kind}:{_cap(cap)}"
    if name not in arms:
        raise ValueError(f"cap: {run.spec.name!r} has no {kind} arm at cap {_cap(cap)} in torch's default mode "
                         f"(ddp_optimizer); its arms: {', '.join(arms) or 'none'}. Pass a cap it ran, or the run "
                         f"of recipes.eager_and_compiled")
    return arms[name]


@reading(run="compiled-ddp")
def split(run) -> pd.DataFrame:
    """Per cap: the graphs the backend compiled (the lab's count) and those DDPOptimizer's records account
    for, the buckets of its split (and any parameter name in it that is not the model's), its first
    bucket's bytes, and DDP's own buckets in the same
    compiled step (count, first bucket's bytes), with how many parameters sit in the same bucket in both."""
    sizes = run.ranks[0].result.parameter_bytes
    rows = []
    for a in (a for a in run.ranks[0].result.arms if a.compiled and a.mode == "ddp_optimizer"):
        ddp = a.ddp_buckets
        where = {p: i for i, b in enumerate(ddp) for p in b}
        same = sum(1 for i, b in enumerate(a.split) for p in b.params if where.get(p) == i)
        rows.append({"cap_mb": _cap(a.cap_mb), "graphs_compiled": a.graphs_compiled,
                     "graphs_recorded": a.recorded_graphs, "split_buckets": len(a.split),
                     "unknown_names": sum(1 for b in a.split for p in b.params if p not in sizes),
                     "split_first_mib": a.split[0].bytes / 2 ** 20 if a.split else 0.0,
                     "ddp_buckets": len(ddp), "ddp_first_mib": sum(sizes[p] for p in ddp[0]) / 2 ** 20 if ddp else 0.0,
                     "params_in_same_bucket": f"{same} of {len(where)}"})
    if not rows:
        raise ValueError(f"run: {run.spec.name!r} has no compiled arm in torch's default mode (ddp_optimizer), "
                         f"whose split this table shows; its arms: {', '.join(_arms(run)) or 'none'}. Pass the run "
                         f"of recipes.eager_and_compiled")
    return pd.DataFrame(rows).set_index("cap_mb")


@reading_no_run
def verify_graphs_match_split(table: pd.DataFrame) -> None:
    """torch's record and the lab's count agree: the backend compiled one graph per bucket of
    DDPOptimizer's split (plus one per graph it saw without parameters), at every cap. That holds by
    torch's construction, so it is a guard on the lab's instrumentation, not a lesson: it prints what it
    read, and raises `verify.CheckFailed` only where the two records part (the table would be wrong)."""
    compiled, recorded, unknown = (list(table[c]) for c in ("graphs_compiled", "graphs_recorded", "unknown_names"))
    if compiled != recorded:
        raise verify.CheckFailed(f"NOT verified: graphs the backend compiled = the graphs DDPOptimizer's records "
                                 f"account for, per cap: expected {recorded}, seen {compiled}")
    if any(unknown):
        raise verify.CheckFailed(f"NOT verified: parameters in DDPOptimizer's record that are not the model's, per "
                                 f"cap: expected none, seen {unknown}")
    print(f"read from torch: DDPOptimizer's record accounts for every graph compiled ({', '.join(map(str, compiled))} "
          "per cap), all of the model's parameters")


@reading_no_run
def split_matches_ddp(table: pd.DataFrame) -> list[str]:
    """Per cap, one sentence: whether DDPOptimizer's split has DDP's buckets (count and membership)."""
    out = []
    for cap, row in table.iterrows():
        same, total = (int(x) for x in row["params_in_same_bucket"].split(" of "))
        agree = row["split_buckets"] == row["ddp_buckets"] and same == total
        out.append(f"cap {cap}: the split {'has' if agree else 'does not have'} DDP's buckets ({row['split_buckets']} "
                   f"graphs, {row['ddp_buckets']} buckets; first {row['split_first_mib']:.2f} against "
                   f"{row['ddp_first_mib']:.2f} MiB; {same} of {total} parameters in the same bucket)")
    return out


@reading(run="compiled-ddp")
def ready_order(run, cap=None) -> pd.DataFrame:
    """At one cap, every parameter's gradient: its position in the ready order and its ready time after
    backward started (ms), eager and compiled (the last warm-up step, rank 0)."""
    cols = {}
    for kind in ("eager", "compiled"):
        a = _arm(run, kind, cap)
        cols[f"{kind}_position"] = {e.param: i for i, e in enumerate(a.ready)}
        cols[f"{kind}_ms"] = {e.param: (e.t_ns - a.backward_start_ns) / 1e6 for e in a.ready}
    return pd.DataFrame(cols)


@reading(run="compiled-ddp")
def verify_ready_under_compile(run) -> None:
    """Every trainable parameter's post-accumulate-grad hook fired once in the compiled step too (torch's
    default mode, ddp_optimizer): the readiness probe works under torch.compile. Raises
    `verify.CheckFailed` otherwise."""
    want = len(run.ranks[0].result.parameter_bytes)
    seen = [len(a.ready) for r in run.ranks for a in r.result.arms if a.compiled and a.mode == "ddp_optimizer"]
    verify.equal("gradients seen ready in one compiled step, per cap and rank (every trainable parameter's)",
                 seen, [want] * len(seen))


@reading(run="compiled-ddp")
def modes(run) -> pd.DataFrame:
    """Per compiled arm (cap and `optimize_ddp` mode), what rank 0 saw in one step: graphs compiled, the
    gradients whose post-accumulate-grad hook fired, the buckets DDP's comm hook was handed, and when its
    first gradient became ready and its first all-reduce was launched, as fractions of its backward (from
    its start to the last gradient ready; `backward_fractions`), beside its eager twin's."""
    arms = run.ranks[0].result.arms
    eager = {a.cap_mb: a for a in arms if not a.compiled}
    rows = []
    for i, a in enumerate(arms):
        if a.compiled:
            first_ready, first_launch = backward_fractions(a)
            rows.append({"arm": a.name, "mode": a.mode, "graphs_compiled": a.graphs_compiled,
                         "gradients_seen_ready": len(a.ready), "ddp_buckets_seen": len(a.ddp_buckets),
                         "first_ready_at": first_ready, "first_all_reduce_at": first_launch,
                         "eager_first_ready_at": backward_fractions(eager[a.cap_mb])[0] if a.cap_mb in eager else None,
                         "param_gap_to_eager": max(r.result.arms[i].param_gap for r in run.ranks)})
    return pd.DataFrame(rows).set_index("arm")


@reading_no_run
def backward_fractions(arm) -> tuple[float, float]:
    """(first gradient ready, first all-reduce launched), each as a fraction of the arm's backward: from its
    start to its last gradient ready (NaN where the arm recorded none)."""
    if not arm.ready:
        return float("nan"), float("nan")
    start, span = arm.backward_start_ns, max(e.t_ns for e in arm.ready) - arm.backward_start_ns
    launch = (min(arm.bucket_launch_ns) - start) / span if arm.bucket_launch_ns and span > 0 else float("nan")
    return (min(e.t_ns for e in arm.ready) - start) / span if span > 0 else float("nan"), launch


@reading(run="compiled-ddp")
def verify_no_optimization_waits(run) -> None:
    """`no_optimization` compiles one graph, so its backward is one node that computes every gradient before
    any is accumulated: on every rank, no gradient of such an arm is ready before half of its backward
    (its eager twin's first is ready within the first few percent). Raises `verify.CheckFailed` otherwise."""
    seen = [backward_fractions(a)[0] for r in run.ranks for a in r.result.arms if a.compiled and a.mode == "no_optimization"]
    if not seen:
        raise ValueError(f"run: {run.spec.name!r} has no no_optimization arm; run recipes.eager_and_compiled("
                         f"modes=('no_optimization',))")
    verify.above("no_optimization: its first gradient is ready only after half of backward (fraction of backward, "
                 "every rank)", seen, 0.5)


@reading(run="compiled-ddp")
def verify_same_training(run, rel: float = SAME_TRAINING_REL) -> None:
    """Every compiled arm ended its steps with the eager arm's parameters (same start, same batches, same
    steps), on every rank: compiling changed the schedule, not the mathematics. Under a backend that runs
    the eager kernels (`EXACT_BACKENDS`) on 2 ranks bit for bit; otherwise within `rel` (Inductor may
    reassociate float32 sums, a ring of 3 or more ranks adds in its buckets' order). Raises
    `verify.CheckFailed` otherwise."""
    arms = [a for r in run.ranks for a in r.result.arms if a.compiled]
    gaps, modes = [a.param_gap for a in arms], "/".join(sorted({a.mode for a in arms}))
    what = f"{run.spec.name} ({modes}): largest relative difference between a compiled arm's parameters and its eager twin's"
    if run.spec.task.backend in EXACT_BACKENDS and run.world_size == 2:
        verify.equal(f"{what} ({run.spec.task.backend}: bit for bit)", max(gaps), 0.0)
    else:
        verify.below(what, gaps, rel)


@reading(run="compiled-ddp")
def bursts(run, cap=None) -> pd.DataFrame:
    """At one cap, per compiled piece (DDPOptimizer's bucket, in DDP's order): its own parameters, and how
    long their gradients took to become ready from the first to the last, eager and compiled (ms). A
    parameter in several pieces (a tied weight) is left out of each: its gradient is ready once, after its
    last use; `attrs["shared"]` names it with its pieces and when it was ready compiled."""
    order = ready_order(run, cap)
    split = _arm(run, "compiled", cap).split
    counts = Counter(p for b in split for p in b.params)
    rows = []
    for i, b in enumerate(split):
        part = order.loc[[p for p in b.params if p in order.index and counts[p] == 1]]
        rows.append({"piece": i, "parameters": len(part), "eager_spread_ms": part["eager_ms"].max() - part["eager_ms"].min(),
                     "compiled_spread_ms": part["compiled_ms"].max() - part["compiled_ms"].min()})
    table = pd.DataFrame(rows).set_index("piece")
    table.attrs["shared"] = {p: ([i for i, b in enumerate(split) if p in b.params], float(order.loc[p, "compiled_ms"]))
                             for p, n in counts.items() if n > 1 and p in order.index}
    return table


@reading_no_run
def burst_reading(table: pd.DataFrame) -> str:
    """One sentence from a `bursts` table: each piece's ready span, compiled against eager, and the shared
    parameters left out."""
    shared = "; ".join(f"{p}, in pieces {' and '.join(map(str, pieces))}, is ready once, {ms:.1f} ms into backward"
                       for p, (pieces, ms) in table.attrs.get("shared", {}).items())
    return (f"Compiled, each piece's own gradients became ready within {table['compiled_spread_ms'].max():.2f} ms of "
            f"each other; eager, within {table['eager_spread_ms'].min():.1f} to {table['eager_spread_ms'].max():.1f} ms"
            + (f". Left out: {shared}" if shared else ""))


@reading_no_run
def order_moves(table: pd.DataFrame) -> str:
    """One sentence on how many gradients compile moved in the ready order (`stats.moves`; from a
    `ready_order` table), and which came first."""
    eager_order = table.sort_values("eager_position")
    moved = moves(eager_order.index, table.sort_values("compiled_position").index)
    first = eager_order.index[0], table["compiled_position"].idxmin()
    return (f"{moved} of {len(table)} gradients change place in the ready order (the fewest that, moved, turn eager's "
            f"order into compiled's); eager's first is {first[0]}, compiled's {first[1]}; the last is ready "
            f"{table['eager_ms'].max():.1f} ms into backward eager, {table['compiled_ms'].max():.1f} ms compiled")


@reading(run="compiled-ddp")
def verify_compile_moves_readiness(run) -> None:
    """Compiling changes when gradients become ready: on every rank, at every cap, the compiled step's ready
    order differs from eager's (torch's default mode). Raises `verify.CheckFailed` where it is the same."""
    moved = [moves([e.param for e in ea.ready], [e.param for e in ca.ready])
             for r in run.ranks for ea in r.result.arms for ca in r.result.arms
             if not ea.compiled and ca.compiled and ca.mode == "ddp_optimizer" and ca.cap_mb == ea.cap_mb]
    verify.above("gradients compiling moved in the ready order (the fewest that, moved, turn eager's order into "
                 "compiled's), fewest over ranks and caps",
                 min(moved) if moved else 0, 0)


@reading(run="compiled-ddp")
def paired_ms(run, name: str, field: str = "step_ms") -> list[float]:
    """An arm's timed steps in (round, step) order, each timed by its slowest rank."""
    return slowest_rank([[getattr(s, field) for s in _arms(run, r.rank)[name].steps] for r in run.ranks])


@reading(run="compiled-ddp")
def steps(run) -> pd.DataFrame:
    """Per compiled arm (cap and mode): the first compiled step (its compile), eager's, then the median step
    of each and this run's finding on compiled against eager (paired steps; a family over the arms), with a
    quiet reference run's answer where this run cannot resolve it (`claims.noted`; the column only if any);
    last, each arm's quartiles over its paired steps (`eager_q1_ms` ... `compiled_q3_ms`), their spread."""
    arms = _arms(run)
    compiled = [a for a in arms.values() if a.compiled]
    alpha = claims.family(len(compiled))
    rows = []
    for c in compiled:
        e = arms[c.name.replace("compiled", "eager", 1)]
        timed = {"eager": paired_ms(run, e.name), "compiled": paired_ms(run, c.name)}
        v = claims.paired(f"compiled ({c.mode}) is faster than eager at cap {_cap(c.cap_mb)}", timed["compiled"],
                          timed["eager"], below=0.0, alpha=alpha)
        rows.append({"arm": c.name, "first_step_s_compiled": c.first_steps_s[0],
                     "first_step_s_eager": e.first_steps_s[0],
                     "eager_ms": statistics.median(timed["eager"]), "compiled_ms": statistics.median(timed["compiled"]),
                     "difference_ms": v.center, "interval_ms": f"[{v.low:+.1f}, {v.high:+.1f}]",
                     "compiled faster?": claims.answer(v), "reference run": claims.noted(v),
                     **{f"{kind}_q{q}_ms": pd.Series(ms).quantile(q / 4) for kind, ms in timed.items() for q in (1, 3)}})
    table = pd.DataFrame(rows).set_index("arm")
    return table if table["reference run"].any() else table.drop(columns="reference run")


@reading_no_run
def steps_reading(table: pd.DataFrame) -> str:
    """One sentence on a `steps` table: at how many arms compiling was faster, slower or not told apart
    from eager, and the compile paid up front (first compiled step minus first eager step)."""
    said = table["compiled faster?"].value_counts()
    up_front = float((table["first_step_s_compiled"] - table["first_step_s_eager"]).sum())
    parts = [f"{n} {word}" for key, word in (("yes", "faster"), ("no, the opposite", "slower"), ("not resolved", "not told "
             "apart from eager")) if (n := int(said.get(key, 0)))]
    tail = ("; the difference, if any, is within this machine's noise" if said.get("not resolved", 0) == len(table) else "")
    return f"of {len(table)} compiled arm(s): {', '.join(parts)}{tail}; compiling cost {up_front:.1f} s up front"
