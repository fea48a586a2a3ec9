"""The communication hooks' payload rule and step model (`predict/compression.py`), and the compression
spec's refusals: pure, no launch. The rule is checked against torch's own `_should_compress`; the
reasons the spec gives for leaving a hook out are checked against torch as installed."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from ddplab.predict import compression
from ddplab.predict.compression import PowerSGD
from ddplab.spec import Compression, Experiment, Link


def test_payload_rule_by_hand():
    shapes = [[8, 4], [8]]   # 40 parameters: one matrix PowerSGD compresses at rank 1, one bias it does not
    one = PowerSGD(rank=1, start_iter=2, min_compression_rate=2)
    assert compression.hook_calls("allreduce", shapes) == [160]
    assert compression.hook_calls("fp16", shapes) == compression.hook_calls("bf16", shapes) == [80]
    assert compression.hook_calls("noop", shapes) == []
    assert compression.hook_calls("powersgd", shapes, step=1, psgd=one) == [160]      # before start_powerSGD_iter
    assert compression.hook_calls("powersgd", shapes, step=2, psgd=one) == [32, 32, 16]   # bias, P (8x1), Q (4x1)
    assert compression.written_bytes("fp16", shapes, world_size=4, framing_per_call=100) == 80 * 1.5 + 100
    # every tensor compressed: the uncompressed call is empty and writes nothing, framing included
    assert compression.written_bytes("powersgd", [[8, 4]], 2, 100, step=2, psgd=one) == (32 + 16) + 2 * 100
    # gloo's framing as a function of each call's size: every call pays its own
    assert compression.written_bytes("powersgd", shapes, 2, lambda n: n, step=2, psgd=one) == 2 * (32 + 32 + 16)


def test_gloos_framing_grows_with_its_1_mib_pieces():
    """The rule's arithmetic (the slow test tests/tasks/test_compression.py checks it on real ranks)."""
    mib = 2 ** 20
    assert compression.gloo_framing(16, 2) == compression.gloo_framing(4 * mib, 2) == 4 * 144
    assert [compression.gloo_framing(n * mib, 2) for n in (6, 15, 16)] == [6 * 144, 16 * 144, 16 * 144]
    assert compression.gloo_framing(8 * mib, 4) == 12 * 144 and compression.gloo_framing(14 * mib, 4) == 24 * 144
    with pytest.raises(ValueError, match="n_bytes"):
        compression.gloo_framing(8, 2)   # 2 elements on 2 ranks: pieces left empty, outside the rule


ORACLE = """
import json, sys, torch, torch.distributed as dist, torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 64), nn.Linear(64, 3), nn.Conv1d(3, 5, 3), nn.Linear(1, 2, bias=False))
out = {"shapes": [list(p.shape) for p in model.parameters()]}
for rank, rate in json.loads(sys.argv[1]):
    ddp = DDP(model, bucket_cap_mb=64)
    state = psgd.PowerSGDState(None, matrix_approximation_rank=rank, start_powerSGD_iter=2, min_compression_rate=rate)
    ddp.register_comm_hook(state, psgd.powerSGD_hook)
    for _ in range(3):
        ddp(torch.randn(4, 3, 16)).sum().backward()
    out[f"{rank},{rate}"] = [state.p_memory_dict[0].numel(), state.q_memory_dict[0].numel()]
print(json.dumps(out))
dist.destroy_process_group()
"""
SETTINGS = [(1, 2.0), (2, 2.0), (4, 1.0), (1, 0.5)]   # at 0.5 the biases (1-D) are compressed too


@pytest.fixture(scope="module")
def torchs_hook():
    """What torch's own powerSGD_hook allocates, run by DDP on a one-rank gloo group in a process of its
    own (no process group is left behind in the test's)."""
    got = subprocess.run([sys.executable, "-c", ORACLE, json.dumps(SETTINGS)], capture_output=True, text=True,
                         timeout=120)
    assert got.returncode == 0, got.stderr[-2000:]
    return json.loads(got.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("rank,rate", SETTINGS)
def test_the_rule_matches_what_torchs_hook_allocates(torchs_hook, rank, rate):
    """The oracle is torch's own hook: the sizes of the P and Q it allocates, against the rule's calls."""
    shapes, (p, q) = torchs_hook["shapes"], torchs_hook[f"{rank},{rate}"]
    calls = compression.hook_calls("powersgd", shapes, step=2, psgd=PowerSGD(rank, 2, rate))
    whole = sum(compression.numel(s) for s in shapes if not compression.compresses(s, PowerSGD(rank, 2, rate)))
    assert calls == [4 * whole, 4 * p, 4 * q]
    assert 0 < calls[1] < 4 * sum(compression.numel(s) for s in shapes)


def test_a_1d_gradient_passes_torchs_test_only_below_a_rate_of_1(torchs_hook):
    """Chapter 10's words on a 1-D tensor (a bias): an n x 1 matrix, so r = 1 and (n + 1) x rate < n, never at
    the default rate 2 and for all but the shortest at 0.5; read from torch's own test and hook."""
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState, _should_compress

    import inspect
    assert inspect.signature(PowerSGDState).parameters["min_compression_rate"].default == 2
    for n in (1, 2, 64, 10**6):
        assert not _should_compress(n, 1, 1, 2)[0] and not compression.compresses([n], PowerSGD(1, 2, 2.0))
        assert _should_compress(n, 1, 1, 0.5)[0] == compression.compresses([n], PowerSGD(1, 2, 0.5)) == (n > 1)
    biases = [s for s in torchs_hook["shapes"] if len(s) == 1]
    assert biases and all(compression.compresses(s, PowerSGD(1, 2, 0.5)) for s in biases)   # in the hook's P above


def test_a_0d_gradient_is_refused_as_torch_refuses_it():
    with pytest.raises(ValueError, match="0-d"):
        compression.hook_calls("powersgd", [[]], step=5)


def test_gpt2_shapes_are_gpt2_small():
    assert sum(compression.numel(s) for s in compression.gpt2_shapes()) == 124_439_808


def test_the_step_model_adds_each_calls_wire_time_to_the_local_step():
    call_s = lambda b: 1e-3 + b * 1e-6   # noqa: E731
    assert compression.step_ms(10.0, [1000, 2000], call_s) == pytest.approx(10 + 2 + 3)
    assert compression.step_ms(10.0, [1000], call_s, link_s=lambda b: 0.5) == pytest.approx(10 + 2 + 500)
    assert compression.step_ms(10.0, [], call_s) == 10.0
    assert compression.comm_ms("noop", [[4, 4]], 8, 1e9, 1e-5) == 0.0


@pytest.mark.parametrize("fields,named", [
    (dict(task=Compression(hooks=("fp16", "allreduce"))), "task.hooks"),
    (dict(task=Compression(hooks=("allreduce", "batched_powersgd"))), "task.hooks"),
    (dict(task=Compression(hooks=("allreduce", "int8"))), "task.hooks"),
    (dict(task=Compression(start_powerSGD_iter=1)), "task.start_powerSGD_iter"),
    (dict(task=Compression(matrix_approximation_rank=0)), "task.matrix_approximation_rank"),
    (dict(task=Compression(learn_steps=-1)), "task.learn_steps"),
    (dict(task=Compression(), world_size=1), "world_size"),
    (dict(task=Compression(), dtype="float64"), "dtype"),
    (dict(task=Compression(), local_batch=(4, 8)), "local_batch"),
    (dict(task=Compression(learn_steps=2)), "task.learn_steps"),
    (dict(task=Compression(), backend="nccl"), "backend"),
])
def test_a_bad_setting_is_refused_before_launch_naming_its_field(fields, named):
    with pytest.raises(ValueError, match=named.replace(".", r"\.")):
        Experiment(**{"world_size": 2, **fields})


def test_the_comparison_runs_on_an_emulated_link_and_round_trips():
    exp = Experiment(world_size=2, task=Compression(), link=Link.named("1GbE"))
    assert Experiment.from_json(exp.to_json()) == exp
    assert Link.named("1GbE").wire_s(1000, 2, calls=3) == pytest.approx(3 * 2 * 50e-6 + 1000 * 8 / 1e9)


@pytest.mark.parametrize("hook, dtype", [("fp16", torch.float16), ("bf16", torch.bfloat16)])
@pytest.mark.parametrize("ranks", [2, 3, 4, 6])
def test_rounding_bound_holds_and_is_tight_for_a_cast_and_sum(hook, dtype, ranks):
    """torch's hook casts each rank's gradient, divides by D and sums in the format: every element's error
    stays within the bound, and the worst comes close to it (the bound is not loose by a factor)."""
    gen = torch.Generator().manual_seed(ranks)
    g = torch.randn(ranks, 200_000, generator=gen) * torch.exp(torch.randn(ranks, 200_000, generator=gen))
    total = torch.zeros(g.shape[1], dtype=dtype)
    for r in range(ranks):   # as torch's hook: cast, divide by D in the format, sum in the format
        total = total + g[r].to(dtype).div_(ranks)
    exact = g.double().mean(0)
    scale = g.double().abs().mean(0)
    normal = g.abs().min(0).values / ranks >= 2.0 ** -14
    worst = float(((total.double() - exact).abs()[normal] / scale[normal]).max())
    bound = compression.rounding_bound(hook, ranks)
    assert 0.4 * bound < worst <= bound   # near the bound: it is not loose by a large factor
    with pytest.raises(ValueError, match="hook, ranks"):
        compression.rounding_bound("powersgd", ranks)
