"""The per-rank memory table: parameter, gradient and optimizer-state bytes after step 1's optimizer
step, and the activation bytes held after its forward, on every rank, as the ledger counts them.
They do not depend on the seed, so the checker's hidden run must give the same bytes exactly."""

from __future__ import annotations

from .report import Finding
from .shape import by_rank, fields, number

MODEL_STATE = ("parameters", "gradients", "optimizer_state")
CATEGORIES = (*MODEL_STATE, "activations")
STEP = 1   # the step whose ledger the table reads: the optimizer holds its state from step 0's update on
MIB = 2 ** 20
HINT = "a table {rank: {parameters, gradients, optimizer_state, activations}} in bytes, read off the run's memory ledger"


def truth(run) -> dict[int, dict[str, int]]:
    out = {}
    for r in run.ranks:
        st = r.memory.steps[STEP]
        out[r.rank] = {**{c: st.phases["step"][c] for c in MODEL_STATE}, "activations": st.phases["forward"]["activations"]}
    return out


def judge(ev, exp, runs) -> list[Finding]:
    mine = by_rank(ev, "memory")
    rows = {r: fields(row, f"memory[{r}]", CATEGORIES) for r, row in mine.items()}
    held = truth(runs["exercise-hidden"])
    missing = [r for r in held if r not in rows]
    if missing:
        return [Finding("memory", "every rank", False, f"rank(s) {missing} missing: the table needs a row for every "
                        f"one of the {exp.world_size} ranks, since every rank holds its own copy")]
    d = exp.world_size
    out = []
    wrongs = {cat: [(r, v, row[cat]) for r, row in held.items()
                    if (v := number(rows[r][cat], f"memory[{r}][{cat!r}]")) != row[cat]] for cat in CATEGORIES}
    # a row that passes states its bytes only when every row passes: gradients are the parameters' bytes and
    # Adam's state twice them, so a passing row would hand over a failing row's answer
    all_right = not any(wrongs.values())
    for cat, wrong in wrongs.items():
        if not wrong and not all_right:
            out.append(Finding("memory", cat, True, "every rank's value is exactly what the ledger counts"))
            continue
        if not wrong:
            values = sorted({row[cat] for row in held.values()})
            said = f"{values[0]:,} bytes on every rank" if len(values) == 1 else \
                f"{', '.join(f'rank {r}: {row[cat]:,}' for r, row in held.items())} bytes"
            out.append(Finding("memory", cat, True, f"{said}, exactly as the ledger counts"))
            continue
        r, v, t = wrong[0]   # feedback says what is wrong, never the ledger's number
        moment = "forward" if cat == "activations" else "optimizer step"
        if cat in MODEL_STATE and t and abs(v * d - t) <= d:
            msg = (f"{cat} on rank {r} looks divided by the world size: classic DDP replicates parameters, gradients "
                   f"and optimizer state on every rank; it divides none of them by the world size (that is what "
                   f"ZeRO and FSDP change)")
        elif t and abs(v * MIB - t) <= 0.0051 * MIB:
            msg = f"{cat} on rank {r}: {v} looks like MiB, rounded; write the ledger's bytes"
        elif cat == "optimizer_state" and v == 0 and t:
            msg = (f"rank {r} holds optimizer state after step {STEP}'s optimizer step (the optimizer creates it "
                   f"lazily, at its first step); you wrote 0")
        else:
            side = "more" if v > t else "less"
            msg = (f"{cat} on rank {r}: you wrote {v:,.0f} bytes, {side} than the ledger counts after step {STEP}'s "
                   f"{moment} (run.ranks[{r}].memory.steps[{STEP}].phases)")
        out.append(Finding("memory", cat, False, msg))
    return out
