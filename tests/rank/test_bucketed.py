"""BucketedSync: plan validation, in-process behaviour on a 1-rank group, and real 2- and 4-rank
sweeps where its reduced gradients and updates are compared with torch DDP's."""

import statistics

import pytest
import torch
import torch.distributed as dist

import ddplab
from ddplab import record
from ddplab.predict.buckets import Cost
from ddplab.predict.comm import AlphaBeta
from ddplab.rank.parallel.bucketed import BucketedSync
from ddplab.rank.probes.buckets import BucketLog
from ddplab.spec import BucketSweep
from ddplab.tables import bucket_sweep, buckets
from tests.support import launch_leftovers, share


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b, self.unused = torch.nn.Linear(4, 8), torch.nn.Linear(8, 2), torch.nn.Linear(2, 2)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def test_plan_must_cover_every_parameter_once_before_any_communication():
    net = Net()
    with pytest.raises(ValueError, match=r"plan: .*missing: \['unused.bias', 'unused.weight'\]"):
        BucketedSync(net, [["a.weight", "a.bias", "b.weight", "b.bias"]])
    with pytest.raises(ValueError, match=r"twice: \['a.bias'\]"):
        BucketedSync(net, [["a.weight", "a.bias", "a.bias", "b.weight", "b.bias", "unused.weight", "unused.bias"]])


@pytest.fixture(scope="module")
def one_rank_group(tmp_path_factory):
    store = dist.FileStore(str(tmp_path_factory.mktemp("store") / "f"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_one_rank_gradients_unchanged_and_an_unused_parameter_is_named(one_rank_group):
    net, ref = Net(), Net()
    x = torch.randn(5, 4)
    ref(x).square().sum().backward()
    plan = [["b.bias", "b.weight"], ["a.bias", "a.weight"], ["unused.weight", "unused.bias"]]
    no_unused = BucketedSync(net, [plan[0], plan[1] + plan[2]])
    with pytest.raises(RuntimeError, match="unused.bias"):
        no_unused(x).square().sum().backward()
    net2 = Net()
    net2.unused.requires_grad_(False)
    sync = BucketedSync(net2, plan[:2], log=BucketLog())
    sync(x).square().sum().backward()
    for (n, p), (_, q) in zip(net2.named_parameters(), ref.named_parameters()):
        if q.grad is not None:
            assert torch.equal(p.grad, q.grad), n
    events = sync.take()
    assert [e.index for e in events] == [0, 1]            # b's gradients are ready first
    assert all(e.done_ns >= e.launch_ns for e in events)
    assert [e.params for e in events] == plan[:2] and [e.bytes for e in events] == [(2 + 2 * 8) * 4, (8 + 8 * 4) * 4]
    # a plan whose first bucket completes last: the second, complete earlier, still starts after it
    net3 = Net()
    net3.unused.requires_grad_(False)
    backwards = BucketedSync(net3, [plan[1], plan[0]], log=BucketLog())
    backwards(x).square().sum().backward()
    events = backwards.take()
    assert [e.index for e in events] == [0, 1] and events[0].launch_ns <= events[1].launch_ns
    for (n, p), (_, q) in zip(net3.named_parameters(), ref.named_parameters()):
        if q.grad is not None:
            assert torch.equal(p.grad, q.grad), n


def test_the_synchronizer_is_an_nn_module_in_every_respect(one_rank_group):
    """state_dict, load_state_dict, named_buffers, parameters, train/eval and .to() behave as on the
    wrapped module (under the name `module`, as with DDP), and a converted synchronizer still syncs."""
    net = Net()
    net.register_buffer("running", torch.arange(3.0))
    net.unused.requires_grad_(False)   # frozen: in the state, in no bucket
    sync = BucketedSync(net, [["b.bias", "b.weight"], ["a.bias", "a.weight"]])
    assert list(sync.state_dict()) == [f"module.{k}" for k in net.state_dict()]
    assert [n for n, _ in sync.named_buffers()] == ["module.running"]          # the flat tensors are not state
    assert [id(p) for p in sync.parameters()] == [id(p) for p in net.parameters()]
    saved = {k: v.clone() for k, v in sync.state_dict().items()}
    with torch.no_grad():
        for p in net.parameters():
            p.add_(1.0)
        net.running.zero_()
    assert not any(torch.equal(v, saved[k]) for k, v in sync.state_dict().items())
    keys = sync.load_state_dict(saved)
    assert keys.missing_keys == keys.unexpected_keys == []
    assert all(torch.equal(v, saved[k]) for k, v in sync.state_dict().items())    # the round trip restored them
    assert sync.eval() is sync and not sync.training and not net.a.training
    assert sync.train() is sync and sync.training and net.a.training
    assert sync.to("cpu") is sync and sync.module is net
    # a dtype conversion converts the flat tensors too: the float64 gradient equals a float64 reference
    ref = Net().double()
    x = torch.randn(5, 4, dtype=torch.float64)
    ref(x).square().sum().backward()
    sync.double()
    assert net.a.weight.dtype == torch.float64 and net.running.dtype == torch.float64
    sync(x).square().sum().backward()
    for (n, p), (_, q) in zip(net.named_parameters(), ref.named_parameters()):
        if q.grad is not None:
            assert p.grad.dtype == torch.float64 and torch.equal(p.grad, q.grad), n


PLANS = ("ddp:0.004", "plan:0.004", "split:0.004", "ddp-split:0.004", "bare:default", "ddp:default")
SMALL = dict(task=BucketSweep(plans=PLANS, rounds=2, steps_per_round=1), vocab_size=64, d_model=32, n_layers=2,
             n_heads=4, local_batch=2, seq_len=8)


share("bsync", lambda: [ddplab.Experiment(name=f"bsync-{w}", world_size=w, **SMALL) for w in (2, 4)])


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 4])
def test_bucketed_sync_matches_ddp_in_a_real_sweep(shared_runs, world_size):
    run = {r.world_size: r for r in shared_runs["bsync"]}[world_size]
    assert not launch_leftovers(run)
    sweep = run.ranks[0].result
    for name in PLANS:  # a step from identical states with each plan's real buckets: same gradient, same update
        assert sweep.arm(name).check.grad_rel_diff <= 1e-6, name
        assert sweep.arm(name).check.param_rel_diff <= 1e-6, name
        assert sweep.arm(name).check.final_param_rel_diff <= 1e-5, name
    ins = bucket_sweep.inputs(run)
    # DDP's own buckets, as observed by the probe, are the simulator's rule applied to the ready order
    assert buckets.plan_for(run, "ddp:0.004") == buckets.ddp_rule(ins, 0.004)
    assert buckets.plan_for(run, "ddp:default") == buckets.ddp_rule(ins, None)
    assert buckets.plan_for(run, "plan:0.004") == buckets.plan_for(run, "ddp:0.004")
    split = buckets.plan_for(run, "split:0.004")
    assert buckets.is_last_split(split, buckets.plan_for(run, "plan:0.004"))
    # DDP itself, given one bucket_cap_mb_list cap per bucket, builds the split plan tensor for tensor
    assert buckets.plan_for(run, "ddp-split:0.004") == split
    early = bucket_sweep.launched_before_last_ready(run, "split:0.004", len(split) - 2)
    assert len(early) == world_size * SMALL["task"].rounds * SMALL["task"].steps_per_round
    assert bucket_sweep.launched_before_last_ready(run, "split:0.004", len(split)) == []   # no such bucket
    # the last bucket holds the last gradient: it can only be launched once that is ready
    assert not any(bucket_sweep.launched_before_last_ready(run, "split:0.004", len(split) - 1))
    # three prices of one plan's communication, from the same tables the notebook prints
    link = AlphaBeta(1e-4, 1e-9)
    cost = Cost(link)
    price = bucket_sweep.summed_vs_added(run, "ddp:0.004", link, cost, ins, buckets.plan_for(run, "ddp:0.004"))
    per_step = bucket_sweep.steps(run, plans=["ddp:0.004", "compute-only"])
    added = per_step["ddp:0.004"] - per_step["compute-only"]
    assert price["added_ms"] == pytest.approx(statistics.median(added))   # per step, against compute-only around it
    assert price["summed_isolated_ms"] == pytest.approx(sum(cost.allreduce_ms(sum(
        sweep.parameter_bytes[n] for n in b)) for b in buckets.plan_for(run, "ddp:0.004")))
    assert price["summed_in_flight_ms"] > 0 and price["span_ms"] > 0
    assert price["added_low_ms"] <= price["added_ms"] <= price["added_high_ms"]
    # the split's tail verdict pairs, step by step, the lab's one exposed tail (record.exposed_tail_ms:
    # over the ranks, last all-reduce done minus that rank's last ready, clamped at 0) of both plans
    tails = bucket_sweep.steps(run, record.exposed_tail_ms, ["plan:0.004", "split:0.004"])
    for name in ("plan:0.004", "split:0.004"):
        per_rank = [[max(0.0, (max(b.done_ns for b in x.buckets) - x.backward.ready[-1].t_ns) / 1e6)
                     for x in r.result.arm(name).steps] for r in run.ranks]
        raw = [max(step) for step in zip(*per_rank)]
        assert len(raw) == SMALL["task"].rounds * SMALL["task"].steps_per_round
        assert tails[name].tolist() == pytest.approx(raw, abs=1e-6), name
    verdict = bucket_sweep.judge_split_tail(tails, "plan:0.004", "split:0.004")
    assert verdict.n == len(raw) and not verdict.resolved   # 2 pairs: too few to judge at all
    table = bucket_sweep.measured(run)
    assert list(table.index) == ["compute-only", *PLANS]
    assert (table["step_ms"] > 0).all() and table.loc["ddp:0.004", "buckets"] == len(buckets.ddp_rule(ins, 0.004))


def test_a_log_of_another_group_is_refused_and_no_log_records_nothing(one_rank_group):
    net = Net()
    net.unused.requires_grad_(False)
    plan = [["b.bias", "b.weight"], ["a.bias", "a.weight"]]
    with pytest.raises(ValueError, match="log: its group must be the synchronizer's"):
        BucketedSync(net, plan, group=object(), log=BucketLog())
    sync = BucketedSync(net, plan)
    sync(torch.randn(3, 4)).square().sum().backward()
    assert sync.take() == []
