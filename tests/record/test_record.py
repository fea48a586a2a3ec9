"""The rank record (record/): typed records dumped to JSON and parsed back, and files that do not
match the schema refused with the field that is wrong (pure: no ranks launched)."""

from __future__ import annotations

import copy
import json
import re

import pytest

from ddplab import record
from ddplab.record import (AllReduceSweepRecord, Backward, BucketEvent, BucketSweepRecord, Checksums, Distance,
                           Envelope, MemoryRecord, MemoryStep, ModelInfo, PlanCheck, RankRecord, ReadyEvent,
                           ReferenceRecord, SizeCalls, SweepArm, SweepStep, TrainRecord, TrainStep)
from ddplab.results import RankResult

T0 = 5_000_000_000   # a perf_counter_ns origin


def envelope(task: str = "train", rank: int = 1) -> Envelope:
    return Envelope(task=task, rank=rank, local_rank=rank, world_size=2, backend="gloo", device="cpu", pid=4242,
                    host="lab", torch_version="2.4.0", python="3.11.7", spec_hash="0123456789", launch_id="abcdef012345",
                    t_start_ns=1_700_000_000_000_000_000, t_end_ns=1_700_000_001_000_000_000)


def train_record() -> TrainRecord:
    """Two steps: the first with every probe's field, the second with none (their defaults)."""
    ms = lambda m: T0 + int(m * 1e6)  # noqa: E731 - ms after T0, in ns
    first = TrainStep(
        step=0, sample_ids=[4, 5, 6, 7], loss=4.25, loss_sum=136.0, tokens=32,
        phase_ms={"count": 0.5, "data": 0.25, "forward": 3.0, "backward": 6.5, "optimizer": 1.0}, step_ms=11.25,
        param_checksum="00ff00ff00ff00ff",
        backward=Backward(start_ns=T0, end_ns=ms(6.5), ready=[ReadyEvent("head.weight", ms(1.0)),
                                                               ReadyEvent("tok_emb.weight", ms(6.0))]),
        buckets=[BucketEvent(0, 1024, ["head.weight"], ms(1.5), ms(3.0)),
                 BucketEvent(1, 2048, ["tok_emb.weight"], ms(6.25), ms(9.0))],
        write_bytes=3072, activation_bytes=[65536])
    second = TrainStep(step=1, sample_ids=[12, 13, 14, 15], loss=4.0, loss_sum=128.0, tokens=32,
                       phase_ms={"data": 0.25, "forward": 3.0, "backward": 6.0, "optimizer": 1.0}, step_ms=10.25,
                       param_checksum="11ee11ee11ee11ee")
    categories = {"parameters": 3072, "gradients": 0, "ddp_buckets": 3072, "optimizer_state": 0,
                  "activations": 65536, "rss": 10_000_000}
    memory = MemoryRecord(constructed={"parameters": 3072, "gradients": 0, "ddp_buckets": 3072},
                          steps=[MemoryStep(phases={"forward": categories, "backward": {**categories, "activations": 0}},
                                            held_at_start=6144, peak=80_000)])
    reference = ReferenceRecord(ddp=Distance(1e-8, 2.5e-7),
                                independent=Distance(0.03, 0.4, param_checksum="22dd22dd22dd22dd"))
    return TrainRecord(parameter_names=["tok_emb.weight", "head.weight"], model=ModelInfo(768, 3072),
                       param_checksum=Checksums("aa", "bb", "cc"), steps=[first, second], reference=reference,
                       memory=memory)


def bucket_sweep_record() -> BucketSweepRecord:
    step = SweepStep(round=0, forward_ms=3.0, backward_ms=6.0, optimizer_ms=1.0, step_ms=10.0,
                     backward=Backward(T0, T0 + 6_000_000, [ReadyEvent("b", T0 + 1_000_000),
                                                            ReadyEvent("a", T0 + 5_000_000)]),
                     buckets=[BucketEvent(0, 8, [], T0 + 1_500_000, T0 + 2_000_000),
                              BucketEvent(1, 8, [], T0 + 5_500_000, T0 + 8_000_000)])
    compute = SweepStep(round=0, forward_ms=3.0, backward_ms=5.5, optimizer_ms=1.0, step_ms=9.5,
                        backward=Backward(T0, T0 + 5_500_000, [ReadyEvent("b", T0 + 900_000),
                                                               ReadyEvent("a", T0 + 5_000_000)]))
    return BucketSweepRecord(parameter_names=["a", "b"], parameter_bytes={"a": 8, "b": 8}, model=ModelInfo(4, 16),
                             warmup_steps=2, ready_order=["b", "a"], copy_bytes_per_s=2.5e9,
                             arms=[SweepArm("compute-only", [], None, [compute]),
                                   SweepArm("ddp:1", [["b"], ["a"]], PlanCheck(0.0, 1e-9, 2e-9), [step]),
                                   SweepArm("bare:default", [], PlanCheck(0.0, 0.0), [step])])


def file_of(rec: RankRecord) -> dict:
    """What a rank writes: the dumped dict through JSON text."""
    return json.loads(json.dumps(record.dump(rec)))


# ---- round trips ----------------------------------------------------------------------------------
def test_a_train_record_round_trips_through_dump_and_load():
    rec = RankRecord(envelope(), train_record())
    d = file_of(rec)
    assert d["schema_version"] == record.SCHEMA_VERSION == 2 and set(d) == {"schema_version", "envelope", "result"}
    back = record.load(d, TrainRecord)
    assert back == rec
    assert isinstance(back.result.steps[0].backward.ready[0], ReadyEvent)
    assert isinstance(back.result.steps[0].buckets[1], BucketEvent) and back.result.steps[1].buckets is None
    assert back.result.reference.independent.param_checksum == "22dd22dd22dd22dd"
    assert file_of(back) == d


@pytest.mark.parametrize("rec,result_type", [
    (RankRecord(envelope("allreduce-sweep", 0), AllReduceSweepRecord([SizeCalls(4096, [0.5, 0.25], [4096, 4100]),
                                                                      SizeCalls(8192, [0.75, 1.0], [8192, 8200])])),
     AllReduceSweepRecord),
    (RankRecord(envelope("bucket-sweep", 0), bucket_sweep_record()), BucketSweepRecord),
], ids=["allreduce-sweep", "bucket-sweep"])
def test_the_sweep_records_round_trip_too(rec, result_type):
    assert record.load(file_of(rec), result_type) == rec


def test_optional_sections_may_be_absent_or_null_and_whole_floats_may_be_ints():
    d = file_of(RankRecord(envelope(), train_record()))
    del d["result"]["reference"]
    d["result"]["memory"] = None
    d["result"]["steps"][0]["loss"] = 4           # JSON writes 4.0 as 4 in other writers
    back = record.load(d, TrainRecord).result
    assert back.reference is None and back.memory is None
    assert back.steps[0].loss == 4.0 and isinstance(back.steps[0].loss, float)


def test_typed_steps_give_times_after_their_backward_started():
    st = train_record().steps[0]
    assert st.ready_ms() == [("head.weight", 1.0), ("tok_emb.weight", 6.0)]
    assert st.last_ready_ms == 6.0 and st.first_launch_ms == 1.5 and st.comm_end_ms == 9.0
    assert st.after_last_ready_ms == pytest.approx(3.0) and st.backward.ms(st.backward.end_ns) == 6.5
    sweep = bucket_sweep_record()
    assert sweep.arm("ddp:1").check.final_param_rel_diff == 2e-9 and sweep.arm("bare:default").check.final_param_rel_diff is None
    assert sweep.arm("ddp:1").steps[0].after_last_ready_ms == pytest.approx(3.0)


def test_a_rank_result_reads_the_envelope_and_the_train_record():
    rec = RankRecord(envelope(rank=1), train_record())
    r = RankResult(rec.envelope, rec.result)
    assert (r.rank, r.pid, r.backend, r.device, r.host, r.world_size) == (1, 4242, "gloo", "cpu", "lab", 2)
    assert r.param_checksum.final == "cc" and r.model.parameter_bytes == 3072 and r.parameter_names[0] == "tok_emb.weight"
    assert r.reference.ddp.update_rel_error == 2.5e-7 and r.memory.steps[0].peak == 80_000
    assert r.sample_ids == [4, 5, 6, 7, 12, 13, 14, 15]
    assert r.step_ms() == [11.25, 10.25] and r.step_ms("forward") == [3.0, 3.0] and r.step_ms("count") == [0.5, 0.0]


# ---- refusals name the field ------------------------------------------------------------------------
def damaged(change) -> dict:
    d = copy.deepcopy(file_of(RankRecord(envelope(), train_record())))
    change(d)
    return d


def step0(d):
    return d["result"]["steps"][0]


REFUSED = [
    # a wrong type
    (lambda d: step0(d).update(loss="low"), "result.steps[0].loss: expected float, got 'low'"),
    (lambda d: step0(d).update(tokens=32.0), "result.steps[0].tokens: expected int, got 32.0"),
    (lambda d: d["envelope"].update(rank=True), "envelope.rank: expected int, got True"),
    (lambda d: step0(d).update(sample_ids=4), "result.steps[0].sample_ids: expected a list, got int"),
    (lambda d: step0(d)["sample_ids"].__setitem__(2, "6"), "result.steps[0].sample_ids[2]: expected int, got '6'"),
    (lambda d: step0(d)["phase_ms"].update(forward="3"), "result.steps[0].phase_ms.forward: expected float, got '3'"),
    (lambda d: step0(d)["backward"]["ready"][1].update(t_ns=1.5),
     "result.steps[0].backward.ready[1].t_ns: expected int, got 1.5"),
    (lambda d: step0(d)["buckets"][0].update(params="head.weight"),
     "result.steps[0].buckets[0].params: expected a list, got str"),
    (lambda d: d["result"]["memory"]["steps"][0]["phases"]["forward"].update(parameters=None),
     "result.memory.steps[0].phases.forward.parameters: expected int, got None"),
    (lambda d: d["result"].update(model=[768, 3072]), "result.model: expected an object, got list"),
    (lambda d: d["result"]["reference"]["independent"].update(param_checksum=7),
     "result.reference.independent.param_checksum: expected str, got 7"),
    # a missing field
    (lambda d: step0(d).pop("tokens"), "result.steps[0]: lacks the field tokens"),
    (lambda d: d["envelope"].pop("spec_hash"), "envelope: lacks the field spec_hash"),
    (lambda d: d["result"]["param_checksum"].pop("final"), "result.param_checksum: lacks the field final"),
    (lambda d: d.pop("result"), "lacks the field result"),
    # an unknown field
    (lambda d: d["envelope"].update(colour="red"), "envelope: unknown field(s) colour"),
    (lambda d: step0(d).update(backward_write_bytes=3072), "result.steps[0]: unknown field(s) backward_write_bytes"),
    (lambda d: step0(d)["buckets"][1].update(extra=1, also=2), "result.steps[0].buckets[1]: unknown field(s) also, extra"),
    # the wrong schema version
    (lambda d: d.update(schema_version=1), "has schema version 1, expected 2"),
    (lambda d: d.pop("schema_version"), "has schema version None, expected 2"),
]


@pytest.mark.parametrize("change,message", REFUSED, ids=[m for _, m in REFUSED])
def test_a_file_that_does_not_match_the_schema_is_refused_naming_the_field(change, message):
    with pytest.raises(record.RecordError, match=f"^{re.escape(message)}$"):
        record.load(damaged(change), TrainRecord)


def test_a_record_error_is_a_value_error_and_a_non_object_is_refused():
    assert issubclass(record.RecordError, ValueError)
    with pytest.raises(record.RecordError, match="is not a JSON object"):
        record.load([1, 2], TrainRecord)


def test_a_file_of_another_task_is_refused():
    d = file_of(RankRecord(envelope("allreduce-sweep", 0), AllReduceSweepRecord([SizeCalls(4096, [0.5], [4096])])))
    with pytest.raises(record.RecordError, match=r"^result: unknown field\(s\) sizes$"):
        record.load(d, TrainRecord)
