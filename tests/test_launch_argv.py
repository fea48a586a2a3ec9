import os
from pathlib import Path

import pytest

from ddplab import Experiment, launch


def test_torchrun_argv_is_standalone_one_process_per_rank_without_a_fixed_port():
    argv = launch.torchrun_argv(Experiment(world_size=4), Path("runs/x"), python="python3")
    assert argv == ["python3", "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
                    "--nproc-per-node=4", "--max-restarts=0", "-m", "ddplab.worker",
                    "--spec", str(Path("runs/x/spec.json"))]
    assert not any("port" in a for a in argv)


def test_run_dir_is_named_by_recipe_and_hash(monkeypatch, tmp_path):
    monkeypatch.setenv("DDPLAB_RUNS", str(tmp_path))
    e = Experiment(name="demo")
    assert launch.run_dir_for(e) == tmp_path / f"demo-{e.hash}"


def test_worker_env_adds_cwd_and_keeps_callers_pythonpath_and_threads():
    env = launch.worker_env({"PYTHONPATH": "/mine", "OMP_NUM_THREADS": "3"})
    paths = env["PYTHONPATH"].split(os.pathsep)
    assert paths[0] == os.getcwd() and paths[-1] == "/mine"
    assert env["OMP_NUM_THREADS"] == "3"
    assert launch.worker_env({})["OMP_NUM_THREADS"] == "1"


def test_preflight_refuses_more_nccl_ranks_than_gpus_before_launching(tmp_path):
    exp = Experiment(world_size=64, backend="nccl")
    with pytest.raises(ValueError, match="Experiment.backend: NCCL needs one GPU per rank"):
        launch.run(exp, tmp_path / "never")
    assert not (tmp_path / "never").exists()


def test_run_refuses_a_bad_user_model_before_launching(tmp_path):
    with pytest.raises(ValueError, match="Experiment.model"):
        launch.run(Experiment(model="no_such_module_xyz:make"), tmp_path / "never")
    assert not (tmp_path / "never").exists()
