"""Property-based fuzz of the spec: any combination of values is either refused with a ValueError that
names an Experiment field, or accepted and exact through a JSON round trip (same spec, same hash)."""

from __future__ import annotations

import json
import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddplab import Experiment
from ddplab.spec import AllReduceSweep, BucketSweep, Fault, Train

INF = float("inf")
# values that have broken specs before: huge ints, inf and nan, tiny and huge floats, wrong types
junk = st.one_of(st.sampled_from([None, True, -1, 0, 10 ** 400, 2 ** 62, 10 ** 30, INF, -INF, float("nan"), 1e308,
                                  1e-9, "", "x" * 300, [], {"gradients"}, (), 4]),
                 st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=5))
small = st.integers(1, 64)
valid = {
    "name": st.from_regex(r"[a-z][a-z0-9_.-]{0,20}", fullmatch=True),
    "model": st.sampled_from(["transformer", "mlp", "branchy", "pkg.mod:factory"]),
    "vocab_size": st.integers(2, 300), "d_model": st.sampled_from([8, 16, 32]), "n_layers": st.integers(1, 3),
    "n_heads": st.sampled_from([1, 2, 4]), "world_size": st.integers(1, 4), "local_batch": small,
    "seq_len": small, "accum_steps": st.integers(1, 4), "steps": st.integers(1, 5),
    "sync": st.sampled_from(["ddp", "none"]), "loss_norm": st.sampled_from(["rank-mean", "global-sample", "global-token"]),
    "dtype": st.sampled_from(["float32", "float64"]), "sharding": st.sampled_from(["none", "zero1", "fsdp2"]),
    "bucket_cap_mb": st.one_of(st.none(), st.floats(1e-4, 1e3)), "optimizer": st.sampled_from(["sgd", "adam", "adamw"]),
    "lr": st.floats(1e-6, 10), "momentum": st.floats(0, 0.99), "seed": st.integers(0, 2 ** 31 - 1),
    "timeout_s": st.floats(0.5, 3600), "no_sync": st.booleans(), "pin_cpus": st.booleans(),
    "probes": st.lists(st.sampled_from(["reference", "gradients", "buckets", "memory", "readiness", "bytes"]),
                       unique=True, max_size=3).map(tuple),
    "fault": st.one_of(st.none(), st.builds(Fault, st.sampled_from(["crash", "skip-backward", "stall"]),
                                            st.one_of(st.none(), st.integers(0, 3)), st.integers(0, 4))),
    "task": st.one_of(st.builds(Train),
                      st.builds(AllReduceSweep, sweep_bytes=st.lists(st.sampled_from([4, 64, 4096, 2 ** 20]),
                                                                      min_size=1, max_size=3, unique=True).map(tuple),
                                repeats=st.integers(1, 5)),
                      st.builds(BucketSweep, plans=st.lists(st.sampled_from(["ddp:default", "ddp:1", "bare:0.25",
                                                                             "plan:4", "split:4", "ddp:1e400"]),
                                                            min_size=1, max_size=3, unique=True).map(tuple))),
}
# a spec of valid values, with at most one field replaced by junk (so the junk is what gets judged)
fields = st.tuples(
    st.dictionaries(st.sampled_from(sorted(valid)), st.none(), max_size=6).flatmap(
        lambda keys: st.fixed_dictionaries({k: valid[k] for k in keys})),
    st.one_of(st.none(), st.tuples(st.sampled_from(sorted(valid)), junk)),
).map(lambda t: {**t[0], **dict([t[1]] if t[1] else [])})


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fields)
def test_a_spec_is_refused_naming_a_field_or_round_trips_exactly(kwargs):
    try:
        exp = Experiment(**kwargs)
    except ValueError as e:
        assert re.match(r"^Experiment\.\w+(\.\w+)?: ", str(e)), str(e)
        return
    text = exp.to_json()
    json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(AssertionError(f"{c} in spec.json")))
    again = Experiment.from_json(text)
    assert again == exp and again.hash == exp.hash and again.to_json() == text
