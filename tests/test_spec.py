import json
import subprocess
import sys

import pytest

from ddplab import Experiment


def test_defaults_are_valid_and_round_trip_through_json():
    e = Experiment()
    assert Experiment.from_json(e.to_json()) == e


def test_per_rank_lists_round_trip_and_give_per_rank_values():
    e = Experiment(world_size=3, local_batch=[4, 2, 6], seq_len=(8, 8, 16), probes=["reference"])
    assert e.local_batch == (4, 2, 6) and e.probes == ("reference",)
    back = Experiment.from_json(e.to_json())
    assert back == e and back.hash == e.hash
    assert e.local_batches == [4, 2, 6] and e.seq_len_of(2) == 16
    assert e.global_batch == 12


def test_global_batch_is_local_batch_times_world_size_times_accum_steps():
    assert Experiment(world_size=4, local_batch=16, accum_steps=3).global_batch == 16 * 4 * 3


def test_hash_is_short_and_stable_across_processes():
    e = Experiment(world_size=4, bucket_cap_mb=1.5, fault="crash")
    code = ("from ddplab import Experiment; "
            "print(Experiment(world_size=4, bucket_cap_mb=1.5, fault='crash').hash)")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert other == e.hash and len(e.hash) == 10


def test_hash_changes_with_any_field():
    assert Experiment(seed=1).hash != Experiment(seed=2).hash
    assert Experiment(local_batch=8).hash != Experiment(local_batch=(8, 8)).hash


def test_fault_rank_defaults_to_the_last_rank():
    assert Experiment(world_size=4, fault="crash").fault_rank == 3


def test_experiment_is_frozen():
    with pytest.raises(Exception):
        Experiment().world_size = 3


INVALID = [
    ("name", "has space"), ("model", "resnet"), ("model", "no_colon.module"), ("vocab_size", 1),
    ("vocab_size", 0), ("d_model", -4), ("n_layers", 0), ("n_heads", 5), ("world_size", 0),
    ("world_size", 2.0), ("world_size", True), ("local_batch", 0), ("local_batch", (4, 4, 4)),
    ("local_batch", (4, -1)), ("seq_len", 0), ("seq_len", (8,)), ("accum_steps", 0), ("steps", 0),
    ("sync", "allreduce"), ("bucket_cap_mb", -1), ("bucket_cap_mb", 0), ("bucket_cap_mb", "25"),
    ("gradient_as_bucket_view", 1), ("tie_weights", "yes"), ("optimizer", "lamb"), ("lr", 0),
    ("momentum", 1.0), ("seed", -1), ("backend", "mpi"), ("device", "tpu"), ("timeout_s", 0),
    ("fault", "explode"), ("probes", ("telepathy",)), ("sharding", "zero3"), ("loss_norm", "mean"),
    ("dtype", "float16"), ("no_sync", 1),
]


@pytest.mark.parametrize("field,value", INVALID, ids=[f"{f}={v!r}" for f, v in INVALID])
def test_invalid_field_raises_value_error_naming_it(field, value):
    with pytest.raises(ValueError, match=rf"Experiment\.{field}"):
        Experiment(**{"world_size": 2, field: value})


def test_per_rank_list_of_wrong_length_says_both_lengths():
    with pytest.raises(ValueError, match="local_batch: has 3 entries but world_size is 4"):
        Experiment(world_size=4, local_batch=[16, 16, 16])


@pytest.mark.parametrize("kwargs,field", [
    (dict(fault="crash", fault_rank=2), "fault_rank"),
    (dict(fault="crash", fault_rank=-1), "fault_rank"),
    (dict(fault="crash", steps=2, fault_step=2), "fault_step"),
    (dict(fault="skip-backward", world_size=1, fault_rank=0), "fault"),
    (dict(fault="skip-backward", sync="none"), "fault"),
    (dict(momentum=0.9, optimizer="adam"), "momentum"),
    (dict(backend="nccl", device="cpu"), "device"),
    (dict(sharding="zero1", sync="none"), "sharding"),
    (dict(sharding="fsdp2", accum_steps=2), "sharding"),
    (dict(sharding="fsdp2", probes=("gradients",)), "probes"),
    (dict(probes=("memory-snapshot",)), "probes"),
    (dict(probes=("memory", "memory-snapshot"), device="cpu"), "probes"),
])
def test_inconsistent_combinations_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"Experiment\.{field}"):
        Experiment(**{"world_size": 2, **kwargs})


def test_unknown_field_in_json_is_refused():
    d = json.loads(Experiment().to_json())
    d["world_sise"] = 4
    with pytest.raises(ValueError, match="world_sise"):
        Experiment.from_dict(d)


@pytest.mark.parametrize("kwargs,field", [
    (dict(task="allreduce-sweep"), "sweep_bytes"),
    (dict(task="allreduce-sweep", sweep_bytes=(2,)), "sweep_bytes"),
    (dict(task="bench"), "task"),
    (dict(repeats=0), "repeats"),
    (dict(checkpointing="yes"), "checkpointing"),
])
def test_sweep_and_model_fields_are_validated(kwargs, field):
    with pytest.raises(ValueError, match=rf"Experiment\.{field}"):
        Experiment(**kwargs)


@pytest.mark.parametrize("kwargs,field", [
    (dict(timeout_s=float("inf")), "timeout_s"),
    (dict(bucket_cap_mb=float("nan")), "bucket_cap_mb"),
    (dict(task="allreduce-sweep", sweep_bytes=(4096, 4096)), "sweep_bytes"),
    (dict(task="allreduce-sweep", sweep_bytes=(4098,)), "sweep_bytes"),
    (dict(task="allreduce-sweep", sweep_bytes=(4096,), probes=("memory",)), "task"),
    (dict(sharding="fsdp2", tie_weights=True), "tie_weights"),
    (dict(sharding="fsdp2", probes=("readiness",)), "probes"),
])
def test_values_that_would_only_fail_inside_the_ranks_are_refused(kwargs, field):
    with pytest.raises(ValueError, match=rf"Experiment\.{field}"):
        Experiment(**{"world_size": 2, **kwargs})


SWEEP = dict(task="bucket-sweep", plans=("ddp:1", "split:4"))


@pytest.mark.parametrize("kwargs, field", [
    (dict(task="bucket-sweep"), "plans"),                                   # no plans
    (dict(SWEEP, plans=("ddp:1", "ddp:1")), "plans"),                       # twice
    (dict(SWEEP, plans=("fsdp:1",)), "plans"),                              # unknown kind
    (dict(SWEEP, plans=("ddp:0",)), "plans"),                               # cap 0
    (dict(SWEEP, plans=("split:default",)), "plans"),                       # explicit plans need a cap
    (dict(SWEEP, plans=("ddp:-1",)), "plans"),
    (dict(plans=("ddp:1",)), "plans"),                                      # plans on a train task
    (dict(SWEEP, probes=("readiness",)), "task"),
    (dict(SWEEP, accum_steps=2), "task"),
    (dict(SWEEP, local_batch=(2, 4)), "local_batch"),
])
def test_bucket_sweep_plans_are_validated(kwargs, field):
    with pytest.raises(ValueError, match=rf"^Experiment\.{field}:"):
        Experiment(**kwargs)


def test_bucket_sweep_plans_parse_and_round_trip():
    from ddplab.spec import parse_plan

    e = Experiment(task="bucket-sweep", plans=["ddp:default", "bare:0.25", "plan:4", "split:1e-4"])
    assert Experiment.from_json(e.to_json()) == e and e.plans[0] == "ddp:default"
    assert [parse_plan(p) for p in e.plans] == [("ddp", None), ("bare", 0.25), ("plan", 4.0), ("split", 1e-4)]
