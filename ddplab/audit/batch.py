"""The global-batch equation: every rank's local batch, the accumulation steps, and what one optimizer
step learns from, sum of local batches x accum_steps."""

from __future__ import annotations

from .report import Finding
from .shape import batches, get, integer

HINT = "the local batch of every rank, the accumulation steps, and the global batch they make"


def judge(ev, exp, runs) -> list[Finding]:
    local = batches(get(ev, "local_batch", "batch"), "batch['local_batch']", exp.world_size)
    accum = integer(get(ev, "accum_steps", "batch"), "batch['accum_steps']")
    g = integer(get(ev, "global_batch", "batch"), "batch['global_batch']")
    truth = exp.local_batches
    out = [Finding("batch", "local batch of every rank", local == truth,
                   "matches the declared run" if local == truth else
                   f"the declared run gives ranks 0..{exp.world_size - 1} {truth} examples per micro-step; "
                   f"you wrote {local}"),
           Finding("batch", "accumulation steps", accum == exp.accum_steps,
                   "matches the declared run" if accum == exp.accum_steps else
                   f"the declared run accumulates {exp.accum_steps} micro-steps per optimizer step; you wrote {accum}")]
    right = sum(truth) * exp.accum_steps
    if g == right:
        msg = f"{g} = ({' + '.join(map(str, truth))}) x {exp.accum_steps}: every example of every micro-step on every rank"
    elif g == sum(truth) and exp.accum_steps > 1:
        msg = (f"{g} is one micro-step's examples: the global batch counts every micro-step an optimizer step "
               f"accumulates, sum of local batches x accum_steps = {sum(truth)} x {exp.accum_steps} = {right}")
    elif len(set(truth)) > 1 and g == truth[0] * exp.world_size * exp.accum_steps:
        msg = f"{g} assumes every rank has rank 0's batch of {truth[0]}; the local batches differ, so add them: {right}"
    else:
        msg = f"the global batch is sum of local batches x accum_steps = {right}; you wrote {g}"
    out.append(Finding("batch", "global batch = sum of local batches x accumulation steps", g == right, msg))
    return out
