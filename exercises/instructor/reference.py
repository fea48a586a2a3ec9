"""The exercise's reference solution as one function (instructors: the tests and the bench use it; the
exercise's source notebook fills the same evidence piece by piece). Learners: solve it yourself first."""

from __future__ import annotations

from ddplab import exercise


def weighted(values, batches):
    """The global-batch gradient from each rank's local one: each counts with its share b_r / B."""
    return sum(b * v for b, v in zip(batches, values)) / sum(batches)


def fill(exp, run, case) -> dict:
    """Every piece of the evidence, read off the learner's run (`exercise.evidence_run(exp)`) and check
    case (`exercise.check_case(exp, batches)`)."""
    ev = exercise.template(exp)
    ev["batch"] = {"local_batch": exp.local_batches, "accum_steps": exp.accum_steps,
                   "global_batch": sum(exp.local_batches) * exp.accum_steps}
    ev["memory"] = {r.rank: {**{c: r.memory.steps[1].phases["step"][c] for c in exercise.MODEL_STATE},
                             "activations": r.memory.steps[1].phases["forward"]["activations"]} for r in run.ranks}
    t = [case.tensors(r.rank) for r in case.ranks]
    name = max(t[0]["reference"], key=lambda n: min(abs(float(x["local"][n].flatten()[0])) for x in t))  # clearly non-zero everywhere
    ev["gradients"] = {"local_batch": list(case.spec.local_batches), "parameter": name, "element": 0,
                       "local": [float(x["local"][name].flatten()[0]) for x in t],
                       "reduced": float(t[0]["reduced"][name].flatten()[0]),
                       "global_batch_gradient": float(t[0]["reference"][name].flatten()[0]),
                       "convention": weighted}
    st = run.ranks[0].steps[-1]
    ev["readiness"] = {"ready_order": [e.param for e in st.backward.ready]}
    trace = [{"bytes": b.bytes, "launch_ms": st.backward.ms(b.launch_ns), "done_ms": st.backward.ms(b.done_ns)}
             for b in st.buckets]
    last_ready = st.backward.ms(st.backward.ready[-1].t_ns)
    ev["buckets"] = {"count": len(trace), "trace": trace, "last_ready_ms": last_ready,
                     "summed_ms": sum(b["done_ms"] - b["launch_ms"] for b in trace),
                     "exposed_ms": st.exposed_tail_ms}   # the lab's one definition (record.exposed_tail_ms), rank 0's
    payload = sum(b.bytes for b in st.buckets)
    ev["comm"] = {"payload_bytes": payload, "bytes_per_rank": {d: 2 * (d - 1) / d * payload for d in (2, 4, 8)}}
    return ev
