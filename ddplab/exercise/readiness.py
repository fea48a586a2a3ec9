"""The order gradients became ready in backward (rank 0's readiness probe, last step). It depends on
the graph, not on the seed: the checker's hidden run must give the same order."""

from __future__ import annotations

from .report import Finding
from .shape import Malformed, fields

KEYS = ("ready_order",)
HINT = "the parameter names in the order their gradients became ready (the readiness probe)"


def truth(run) -> tuple[list[str], list[str]]:
    r0 = run.ranks[0]
    return [e.param for e in r0.steps[-1].backward.ready], list(r0.parameter_names)


def judge(ev, exp, runs) -> list[Finding]:
    order = fields(ev, "readiness", KEYS)["ready_order"]
    if isinstance(order, (str, bytes, dict)) or not hasattr(order, "__iter__"):
        raise Malformed(f"readiness['ready_order']: a list of parameter names, got {order!r}")
    order = [str(n) for n in order]
    ready, source = truth(runs["exercise-hidden"])
    trainable = [p for p in source if p in set(ready)]
    if order == ready:
        msg = f"all {len(ready)} gradients, in the order backward produced them (first: {ready[0]}, last: {ready[-1]})"
    elif sorted(order) != sorted(ready):
        extra, lost = sorted(set(order) - set(ready)), sorted(set(ready) - set(order))
        msg = (f"the names are not this network's {len(ready)} trainable parameters, once each"
               + (f"; not trainable parameters here: {extra[:3]}" if extra else "")
               + (f"; missing: {lost[:3]}" if lost else ""))
    elif order == trainable:
        msg = ("that is the order the parameters are declared in (model.parameters()), not the order their "
               "gradients became ready: backward starts from the loss, so the output layer's gradients come first; "
               "read the readiness probe's events")
    else:
        k = next(j for j, (a, t) in enumerate(zip(order, ready)) if a != t)
        if order == trainable[::-1]:
            msg = (f"that is the reverse of the declaration order, the textbook assumption; the measured order "
                   f"differs from position {k} on ({order[k]} did not become ready there): read the probe")
        else:
            right = f" (positions 0 to {k - 1} are right)" if k else ""
            msg = f"position {k}: {order[k]} did not become ready there{right}; read the order off the probe's events"
    return [Finding("readiness", "the order gradients became ready", order == ready, msg)]
