import dataclasses
import json
import re
import subprocess
import sys

import pytest

from ddplab import Experiment
from ddplab.spec import AllReduceSweep, BucketSweep, Fault, Straggler, Train


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
    e = Experiment(world_size=4, bucket_cap_mb=1.5, fault=Fault("crash"))
    code = ("from ddplab.spec import Experiment, Fault; "
            "print(Experiment(world_size=4, bucket_cap_mb=1.5, fault=Fault('crash')).hash)")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert other == e.hash and len(e.hash) == 10


def test_hash_changes_with_any_field():
    assert Experiment(seed=1).hash != Experiment(seed=2).hash
    assert Experiment(local_batch=8).hash != Experiment(local_batch=(8, 8)).hash


def test_fault_rank_defaults_to_the_last_rank():
    assert Experiment(world_size=4, fault=Fault("crash")).fault.rank == 3
    assert Experiment(world_size=4, fault=Fault("crash")) == Experiment(world_size=4, fault=Fault("crash", rank=3))


def test_experiment_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'world_size'"):
        Experiment().world_size = 3


INVALID = [
    ("name", "has space"), ("model", "resnet"), ("model", "no_colon.module"), ("vocab_size", 1),
    ("vocab_size", 0), ("d_model", -4), ("n_layers", 0), ("n_heads", 5), ("world_size", 0),
    ("world_size", 2.0), ("world_size", True), ("local_batch", 0), ("local_batch", (4, 4, 4)),
    ("local_batch", (4, -1)), ("seq_len", 0), ("seq_len", (8,)), ("accum_steps", 0), ("steps", 0),
    ("sync", "allreduce"), ("bucket_cap_mb", -1), ("bucket_cap_mb", 0), ("bucket_cap_mb", "25"),
    ("gradient_as_bucket_view", 1), ("tie_weights", "yes"), ("optimizer", "lamb"), ("lr", 0),
    ("momentum", 1.0), ("seed", -1), ("backend", "mpi"), ("device", "tpu"), ("timeout_s", 0),
    ("fault", Fault("explode")), ("probes", ("telepathy",)), ("sharding", "zero3"), ("loss_norm", "mean"),
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
    (dict(fault=Fault("crash", rank=2)), "fault.rank"),
    (dict(fault=Fault("crash", rank=-1)), "fault.rank"),
    (dict(fault=Fault("crash", step=2), steps=2), "fault.step"),
    (dict(fault=Fault("explode")), "fault.kind"),
    (dict(fault=Fault("skip-backward", rank=0), world_size=1), "fault"),
    (dict(fault=Fault("skip-backward"), sync="none"), "fault"),
    (dict(momentum=0.9, optimizer="adam"), "momentum"),
    (dict(backend="nccl", device="cpu"), "device"),
    (dict(sharding="zero1", sync="none"), "sharding"),
    (dict(sharding="fsdp2", accum_steps=2), "sharding"),
    (dict(sharding="fsdp2", probes=("gradients",)), "probes"),
    (dict(probes=("memory-snapshot",)), "probes"),
    (dict(probes=("memory", "memory-snapshot"), device="cpu"), "probes"),
    # settings the train task itself would ignore in this configuration
    (dict(sync="none", bucket_cap_mb=1.0), "bucket_cap_mb"),
    (dict(sharding="fsdp2", gradient_as_bucket_view=True), "gradient_as_bucket_view"),
    (dict(sync="none", probes=("buckets",)), "probes"),
    (dict(no_sync=False), "no_sync"),
])
def test_inconsistent_combinations_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"^Experiment\.{re.escape(field)}:"):
        Experiment(**{"world_size": 2, **kwargs})


def test_unknown_field_in_json_is_refused():
    d = json.loads(Experiment().to_json())
    d["world_sise"] = 4
    with pytest.raises(ValueError, match="world_sise"):
        Experiment.from_dict(d)


@pytest.mark.parametrize("kwargs,field", [
    (dict(task=AllReduceSweep()), "task.sweep_bytes"),
    (dict(task=AllReduceSweep(sweep_bytes=(2,))), "task.sweep_bytes"),
    (dict(task="bench"), "task"),
    (dict(task={"kind": "bench"}), "task"),
    (dict(task=AllReduceSweep(sweep_bytes=(4096,), repeats=0)), "task.repeats"),
    (dict(checkpointing="yes"), "checkpointing"),
])
def test_sweep_and_model_fields_are_validated(kwargs, field):
    with pytest.raises(ValueError, match=rf"^Experiment\.{re.escape(field)}:"):
        Experiment(**kwargs)


@pytest.mark.parametrize("kwargs,field", [
    (dict(timeout_s=float("inf")), "timeout_s"),
    (dict(bucket_cap_mb=float("nan")), "bucket_cap_mb"),
    (dict(task=AllReduceSweep(sweep_bytes=(4096, 4096))), "task.sweep_bytes"),
    (dict(task=AllReduceSweep(sweep_bytes=(4098,))), "task.sweep_bytes"),
    (dict(task=AllReduceSweep(sweep_bytes=(4096,)), probes=("memory",)), "probes"),
    (dict(sharding="fsdp2", tie_weights=True), "tie_weights"),
    (dict(sharding="fsdp2", probes=("readiness",)), "probes"),
])
def test_values_that_would_only_fail_inside_the_ranks_are_refused(kwargs, field):
    with pytest.raises(ValueError, match=rf"^Experiment\.{re.escape(field)}:"):
        Experiment(**{"world_size": 2, **kwargs})


SWEEP = dict(task=BucketSweep(plans=("ddp:1", "split:4")))


@pytest.mark.parametrize("kwargs, field", [
    (dict(task=BucketSweep()), "task.plans"),                                       # no plans
    (dict(task=BucketSweep(plans=("ddp:1", "ddp:1"))), "task.plans"),               # twice
    (dict(task=BucketSweep(plans=("fsdp:1",))), "task.plans"),                      # unknown kind
    (dict(task=BucketSweep(plans=("ddp:0",))), "task.plans"),                       # cap 0
    (dict(task=BucketSweep(plans=("split:default",))), "task.plans"),               # explicit plans need a cap
    (dict(task=BucketSweep(plans=("ddp-split:default",))), "task.plans"),
    (dict(task=BucketSweep(plans=("ddp:-1",))), "task.plans"),
    (dict(task=BucketSweep(plans=("ddp:1",), rounds=0)), "task.rounds"),
    (dict(task=BucketSweep(plans=("ddp:1",), steps_per_round=0)), "task.steps_per_round"),
    (dict(task={"kind": "train", "plans": ["ddp:1"]}), "task"),                     # plans on a train task
    (dict(SWEEP, probes=("readiness",)), "probes"),
    (dict(SWEEP, accum_steps=2), "accum_steps"),
    (dict(SWEEP, local_batch=(2, 4)), "local_batch"),
])
def test_bucket_sweep_plans_are_validated(kwargs, field):
    with pytest.raises(ValueError, match=rf"^Experiment\.{re.escape(field)}:"):
        Experiment(**kwargs)


def test_bucket_sweep_plans_parse_and_round_trip():
    from ddplab.spec import Plan

    e = Experiment(task=BucketSweep(plans=["ddp:default", "bare:0.25", "plan:4", "split:1e-4", "ddp-split:4"]))
    assert Experiment.from_json(e.to_json()) == e and e.task.plans[0] == "ddp:default"
    assert [Plan.parse(p) for p in e.task.plans] == [("ddp", None), ("bare", 0.25), ("plan", 4.0), ("split", 1e-4),
                                                     ("ddp-split", 4.0)]


# ---- fields a task does not read ---------------------------------------------------------------
@pytest.mark.parametrize("field,value", [("optimizer", "adam"), ("gradient_as_bucket_view", True), ("lr", 0.5)])
def test_a_bucket_sweep_refuses_a_training_field_it_does_not_read(field, value):
    with pytest.raises(ValueError, match=rf"^Experiment\.{field}: the bucket-sweep task does not read it; "
                                         rf"leave it at its default"):
        Experiment(**SWEEP, **{field: value})


@pytest.mark.parametrize("field,value", [("probes", ("memory",)), ("fault", Fault("crash"))])
def test_an_allreduce_sweep_refuses_probes_and_faults(field, value):
    with pytest.raises(ValueError, match=rf"^Experiment\.{field}: the allreduce-sweep task does not read it"):
        Experiment(task=AllReduceSweep(sweep_bytes=(4096,)), **{field: value})


def test_a_refusal_names_every_unread_field_set():
    with pytest.raises(ValueError, match=r"^Experiment\.optimizer: .*also set but unread: lr\)$"):
        Experiment(**SWEEP, lr=0.5, optimizer="adam")


def test_fields_the_task_reads_are_accepted():
    e = Experiment(task=BucketSweep(plans=("ddp:1",)), world_size=4, d_model=32, local_batch=2, seed=3, pin_cpus=True)
    assert e.ignored_fields() == [] and e.task.kind == "bucket-sweep"
    assert Experiment(task=AllReduceSweep(sweep_bytes=(4096,)), world_size=3, timeout_s=5).task.kind == "allreduce-sweep"


# ---- every task section round-trips ----------------------------------------------------------------
SECTIONS = [Train(), AllReduceSweep(sweep_bytes=(4096, 8192, 2 ** 20), repeats=3),
            BucketSweep(plans=("ddp:default", "bare:0.25", "plan:4", "split:4"), rounds=2, steps_per_round=3)]


@pytest.mark.parametrize("task", SECTIONS, ids=lambda t: t.kind)
def test_every_task_section_round_trips_through_json_and_keeps_its_hash(task):
    e = Experiment(name="sections", task=task, world_size=3)
    back = Experiment.from_json(e.to_json())
    assert back == e and back.hash == e.hash
    assert type(back.task) is type(task) and back.task.kind == task.kind
    assert json.loads(e.to_json())["task"]["kind"] == task.kind
    assert Experiment.from_json(back.to_json()).hash == e.hash
    # a section that differs from the default task changes the hash
    assert (e.hash == Experiment(name="sections", world_size=3).hash) == (task == Train())


def test_the_fault_section_round_trips_and_keeps_its_hash():
    e = Experiment(world_size=3, steps=2, fault=Fault("skip-backward", rank=1, step=1), timeout_s=5)
    back = Experiment.from_json(e.to_json())
    assert back == e and back.hash == e.hash and back.fault == Fault("skip-backward", rank=1, step=1)
    assert Experiment(world_size=3, steps=2, fault=Fault("crash", rank=1, step=1)).hash != e.hash


def test_a_task_must_be_registered_and_importable_by_the_ranks():
    import dataclasses

    from ddplab.spec import TaskSpec, Train

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Unregistered(Train):
        kind = "unregistered"

    with pytest.raises(ValueError, match=r"^Experiment\.task: Unregistered is not registered"):
        Experiment(task=Unregistered())
    main_task = type("InMain", (Train,), {"__module__": "__main__"})
    from ddplab.spec import tasks
    tasks._REGISTRY["train"], original = main_task, tasks._REGISTRY["train"]
    try:
        with pytest.raises(ValueError, match=r"^Experiment\.task: InMain is defined in __main__"):
            Experiment(task=main_task())
    finally:
        tasks._REGISTRY["train"] = original
    assert isinstance(Experiment().task, TaskSpec)


def test_a_task_that_leaves_name_and_task_out_of_its_reads_still_accepts_them():
    from tests.support.toy_task import Toy

    assert Experiment(name="mine", task=Toy(), world_size=2).name == "mine"


@pytest.mark.parametrize("straggler, field", [
    (dict(rank=2), "straggler.rank"),                       # world_size is 2
    (dict(where="network"), "straggler.where"),
    (dict(ms=0), "straggler.ms"), (dict(ms=float("nan")), "straggler.ms"), (dict(ms=True), "straggler.ms"),
    (dict(ms=20_000), "straggler.ms"),                      # past the lab's 10 s bound
    (dict(ms=(0, 0)), "straggler.ms"), (dict(ms=(20,)), "straggler.ms"),   # a cycle: some delay, 2-16 steps
    (dict(ms=(0, -5)), "straggler.ms"), (dict(ms=(0, 20_000)), "straggler.ms"),
    ({"rank": 1, "speed": 2}, "straggler"),                 # an unknown field
])
def test_a_bad_straggler_is_refused_naming_its_field(straggler, field):
    with pytest.raises(ValueError, match=f"Experiment.{re.escape(field)}"):
        Experiment(world_size=2, straggler=straggler if "speed" in straggler else Straggler(**straggler))


def test_a_cycle_of_delays_round_trips_and_delays_each_step_in_turn():
    e = Experiment(world_size=2, straggler=Straggler(1, "before-backward", (0, 20, 40)))
    assert Experiment.from_json(e.to_json()) == e and e.straggler.ms == (0, 20, 40)
    # each cycle of 3 steps holds every delay once, forwards and backwards in turn
    assert [e.straggler.ms_at(k) for k in range(9)] == [0, 20, 40, 40, 20, 0, 0, 20, 40]


def test_a_straggler_needs_someone_to_wait_for_it_and_round_trips():
    from ddplab.spec import BucketSweep

    with pytest.raises(ValueError, match="world_size >= 2"):
        Experiment(world_size=1, straggler=Straggler(rank=0))
    with pytest.raises(ValueError, match="sync='ddp'"):
        Experiment(sync="none", straggler=Straggler())
    with pytest.raises(ValueError, match="reaches the collective timeout"):
        Experiment(timeout_s=5, straggler=Straggler(ms=6000))
    with pytest.raises(ValueError, match="fsdp2 has none"):
        Experiment(sharding="fsdp2", straggler=Straggler())
    with pytest.raises(ValueError, match="Experiment.straggler: the bucket-sweep task does not read it"):
        Experiment(task=BucketSweep(plans=("ddp:1",)), straggler=Straggler())
    e = Experiment(steps=3, straggler={"rank": 0, "where": "data", "ms": 5})
    assert e.straggler == Straggler(0, "data", 5) and Experiment.from_json(e.to_json()) == e
    assert e.hash != Experiment(steps=3).hash


def test_a_profiled_run_is_kept_short():
    assert Experiment(steps=20, probes=("profile",)).steps == 20
    with pytest.raises(ValueError, match="Experiment.probes: 'profile' traces every step"):
        Experiment(steps=21, probes=("profile",))


def test_a_sweep_plan_is_typed_and_its_name_is_what_specs_records_and_tables_carry():
    from ddplab.spec import BucketSweep
    from ddplab.spec.bucket_sweep import Plan

    assert [str(p) for p in (Plan("ddp", 8.0), Plan("ddp"), Plan("ddp-split", 0.5))] == \
        ["ddp:8", "ddp:default", "ddp-split:0.5"]
    assert Plan.parse("split:4") == Plan("split", 4.0) and Plan.parse(str(Plan("bare"))) == Plan("bare")
    assert BucketSweep(plans=[Plan("ddp", 1), "split:2"]).plans == ("ddp:1", "split:2")   # the spec keeps names
    with pytest.raises(ValueError, match=r"plan 'ddp:eight'"):
        Plan.parse("ddp:eight")
