"""The global-batch equation: every rank's local batch, the accumulation steps, and what one optimizer
step learns from, sum of local batches x accum_steps."""

from __future__ import annotations

from .report import Finding
from .shape import batches, fields, integer

KEYS = ("local_batch", "accum_steps", "global_batch")
HINT = "the local batch of every rank, the accumulation steps, and the global batch they make"


def judge(ev, exp, runs) -> list[Finding]:
    ev = fields(ev, "batch", KEYS)
    local = batches(ev["local_batch"], "batch['local_batch']", exp.world_size)
    accum = integer(ev["accum_steps"], "batch['accum_steps']")
    g = integer(ev["global_batch"], "batch['global_batch']")
    truth = exp.local_batches
    out = [Finding("batch", "local batch of every rank", local == truth,
                   "matches the declared run" if local == truth else
                   f"you wrote {local}, which is not the declared run's local batches: read them off the experiment "
                   f"(exp.local_batches), one per rank"),
           Finding("batch", "accumulation steps", accum == exp.accum_steps,
                   "matches the declared run" if accum == exp.accum_steps else
                   f"you wrote {accum}, which is not how many micro-steps the declared run accumulates per optimizer "
                   f"step (exp.accum_steps)")]
    right, others_ok = sum(truth) * exp.accum_steps, local == truth and accum == exp.accum_steps
    if g == right:   # the breakdown only once both rows above are right: it would hand over their answers
        msg = (f"{g} = ({' + '.join(map(str, truth))}) x {exp.accum_steps}: " if others_ok else f"{g}: ") + \
            "every example of every micro-step on every rank"
    elif not others_ok:   # a named mistake would confirm facts of the rows above
        msg = f"{g} is not the sum of the local batches times accum_steps: fix the rows above first"
    elif g == sum(truth) and exp.accum_steps > 1:
        msg = (f"{g} is one micro-step's examples: the global batch counts every micro-step an optimizer step "
               f"accumulates, so it is the sum of the local batches times accum_steps")
    elif len(set(truth)) > 1 and g == truth[0] * exp.world_size * exp.accum_steps:
        msg = f"{g} assumes every rank has rank 0's batch; the local batches differ, so add them up"
    else:
        msg = f"{g} is not the sum of the local batches times accum_steps"
    out.append(Finding("batch", "global batch = sum of local batches x accumulation steps", g == right, msg))
    return out
