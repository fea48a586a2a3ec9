"""The GPU path. Backend choice is pure and tested everywhere; real CUDA runs skip without CUDA."""

import pytest
import torch

import ddplab
from ddplab.host import choose_backend
from ddplab.spec import Fault

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("backend,device,world,gpus,expected", [
    ("auto", "auto", 4, 0, ("gloo", "cpu")),
    ("auto", "auto", 4, 4, ("nccl", "cuda")),
    ("auto", "auto", 4, 2, ("gloo", "cpu")),
    ("auto", "cpu", 2, 8, ("gloo", "cpu")),
    ("gloo", "cuda", 2, 1, ("gloo", "cuda")),
    ("nccl", "auto", 1, 1, ("nccl", "cuda")),
])
def test_backend_choice(backend, device, world, gpus, expected):
    assert choose_backend(backend, device, world, gpus) == expected


@pytest.mark.parametrize("backend,device,world,gpus,field", [
    ("nccl", "auto", 2, 1, "backend"), ("gloo", "cuda", 2, 0, "device"), ("auto", "cuda", 1, 0, "device"),
])
def test_impossible_backend_requests_name_the_field(backend, device, world, gpus, field):
    with pytest.raises(ValueError, match=rf"Experiment\.{field}"):
        choose_backend(backend, device, world, gpus)


@pytest.mark.gpu
@pytest.mark.slow
@needs_cuda
def test_one_nccl_rank_on_a_gpu(tmp_path):
    run = ddplab.run(ddplab.Experiment(world_size=1, backend="nccl", steps=3), tmp_path / "nccl", progress=False)
    r = run.ranks[0]
    assert r.backend == "nccl" and r.device.startswith("cuda")
    assert all(s.step_ms > 0 for s in r.steps)  # timed with CUDA events


@pytest.mark.gpu
@pytest.mark.slow
@needs_cuda
def test_two_gloo_ranks_share_one_gpu(tmp_path):
    exp = ddplab.Experiment(world_size=2, backend="gloo", device="cuda", steps=2, probes=("reference",))
    run = ddplab.run(exp, tmp_path / "gloo-cuda", progress=False)
    assert all(r.backend == "gloo" and r.device.startswith("cuda") for r in run.ranks)
    assert len({r.param_checksum.final for r in run.ranks}) == 1
    assert all(r.reference.ddp.update_rel_error < 1e-5 for r in run.ranks)


@pytest.mark.gpu
@pytest.mark.slow
@needs_cuda
def test_memory_ledger_reconciles_with_the_cuda_allocator(tmp_path):
    from ddplab import tables

    exp = ddplab.Experiment(world_size=1, backend="nccl", steps=2, optimizer="adam", probes=("memory", "memory-snapshot"))
    run = ddplab.run(exp, tmp_path / "cuda-memory", progress=False)
    table = tables.memory.memory_cuda(run)
    assert (table["cuda_allocated"] >= table["ledger"] - 1e-3).all()
    assert (tmp_path / "cuda-memory" / "rank0.memory.pickle").stat().st_size > 0


@pytest.mark.gpu
@pytest.mark.slow
@needs_cuda
def test_bucket_and_ready_times_on_cuda_are_device_times_inside_backward(tmp_path):
    gpus = torch.cuda.device_count()
    exp = ddplab.Experiment(world_size=min(gpus, 2), backend="nccl", steps=2, bucket_cap_mb=0.25,
                            probes=("buckets", "readiness"))
    for r in ddplab.run(exp, tmp_path / "events", progress=False).ranks:
        b = r.steps[-1].backward
        assert b.start_ns <= b.ready[0].t_ns <= b.ready[-1].t_ns <= b.end_ns
        assert all(k.launch_ns <= k.done_ns <= b.end_ns + 1_000_000 for k in r.steps[-1].buckets)


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_an_nccl_hang_names_the_rank_that_skipped_its_backward(tmp_path):
    exp = ddplab.Experiment(world_size=2, backend="nccl", steps=2, timeout_s=10,
                            fault=Fault("skip-backward", rank=1, step=1))
    with pytest.raises(ddplab.RunFailed) as err:
        ddplab.run(exp, tmp_path / "hang", progress=False, warm=False)
    assert err.value.diagnosis.kind == "hang" and err.value.diagnosis.ranks == [1], str(err.value)
    # on NCCL (never run yet: no device lent): torch's analyzer over the ranks' testimonies agrees
    from ddplab import witnesses

    flight = err.value.diagnosis.flight
    assert flight is not None and flight.dumps, str(err.value)
    assert witnesses.verify_same_rank([1], flight)


def test_memory_snapshot_is_refused_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ValueError, match="Experiment.probes: 'memory-snapshot' needs"):
        ddplab.run(ddplab.Experiment(probes=("memory", "memory-snapshot")))


def test_the_gpu_check_skips_cleanly_without_cuda():
    import subprocess
    import sys
    from pathlib import Path

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: run bench/gpu_check.py itself")
    script = Path(__file__).resolve().parent.parent / "bench" / "gpu_check.py"
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("SKIP gpu_check: no CUDA device here"), out.stdout
