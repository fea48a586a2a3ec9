from pathlib import Path

import pytest

from ddplab import Experiment
from ddplab.launch import cold, torchrun
from ddplab.launch.preflight import preflight


def test_torchrun_argv_is_standalone_one_process_per_rank_without_a_fixed_port():
    argv = torchrun.worker_argv(4, [Path("runs/x/spec.json")], python="python3")
    assert argv == ["python3", "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
                    "--nproc-per-node=4", "--max-restarts=0", "-m", "ddplab.rank.worker",
                    "--spec", str(Path("runs/x/spec.json"))]
    assert not any("port" in a for a in argv)


def test_torchrun_argv_for_several_experiments_lists_every_spec_in_order():
    argv = torchrun.worker_argv(2, [Path("a/spec.json"), Path("b/spec.json")], python="py")
    assert argv[argv.index("--spec") + 1:] == [str(Path("a/spec.json")), str(Path("b/spec.json"))]


def test_the_worker_command_is_torchrun_of_the_worker_module_over_the_specs():
    assert torchrun.worker_argv(2, ["a/spec.json"], python="py") == \
        torchrun.torchrun_argv(2, ["--spec", "a/spec.json"], python="py", module=torchrun.WORKER)
    argv = torchrun.torchrun_argv(2, ["--steps", 3], python="py", module="ddplab.rank.smoke")
    assert argv[-4:] == ["-m", "ddplab.rank.smoke", "--steps", "3"] and "--nproc-per-node=2" in argv


def test_run_many_refuses_duplicates_and_empty_lists(tmp_path):
    with pytest.raises(ValueError, match="experiment 1 is identical to experiment 0"):
        cold.run_many([Experiment(), Experiment()], tmp_path)
    with pytest.raises(ValueError, match="non-empty list"):
        cold.run_many([], tmp_path)


def test_one_launch_needs_one_backend_and_device(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert preflight([Experiment(world_size=2)]) == ("nccl", "cuda")
    with pytest.raises(ValueError, match="one backend and device"):
        preflight([Experiment(world_size=2), Experiment(world_size=2, backend="gloo")])
