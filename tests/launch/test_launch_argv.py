from pathlib import Path

import pytest

from ddplab import Experiment
from ddplab.launch import cold, torchrun
from ddplab.launch.preflight import check_launch


def test_torchrun_argv_is_one_node_one_process_per_rank_on_loopback_without_a_fixed_port():
    argv = torchrun.worker_argv(4, [Path("runs/x/spec.json")], python="python3")
    assert argv == ["python3", "-m", "ddplab.launch.loopback", "--rdzv-backend=ddplab-loopback",
                    "--rdzv-endpoint=127.0.0.1:0", "--rdzv-id=ddplab", "--local-addr=127.0.0.1", "--nnodes=1",
                    "--nproc-per-node=4", "--max-restarts=0", "-m", "ddplab.rank.worker",
                    "--spec", str(Path("runs/x/spec.json"))]
    assert not any("port" in a for a in argv) and argv[4].endswith(":0")  # the kernel picks the ports


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
    assert check_launch([Experiment(world_size=2)]) == ("nccl", "cuda")
    with pytest.raises(ValueError, match="one backend and device"):
        check_launch([Experiment(world_size=2), Experiment(world_size=2, backend="gloo")])


def test_more_ranks_than_this_machine_can_run_are_refused_before_launch(monkeypatch):
    import os

    from ddplab.launch.preflight import MAX_RANKS_PER_CORE

    cores = len(os.sched_getaffinity(0))
    too_many = Experiment(world_size=min(MAX_RANKS_PER_CORE * cores + 1, 1024))
    if too_many.world_size <= MAX_RANKS_PER_CORE * cores:
        pytest.skip("this machine has more cores than the spec allows ranks")
    with pytest.raises(ValueError, match=r"^Experiment\.world_size: .* CPU ranks on .* core"):
        check_launch([too_many])
    monkeypatch.setenv("DDPLAB_SKIP_SIZE_CHECKS", "1")
    assert check_launch([too_many]) == ("gloo", "cpu")


def test_a_model_too_big_for_this_machine_s_memory_is_refused_before_launch():
    huge = Experiment(vocab_size=10 ** 6, d_model=2 ** 14, n_layers=1, n_heads=4, world_size=2)   # ~34 G params
    with pytest.raises(ValueError, match=r"^Experiment\.world_size: 2 ranks .* would need about \d+\.\d GiB"):
        check_launch([huge])


def test_every_lab_recipe_fits_this_machine():
    from ddplab import recipes

    for make in (recipes.first_launch, recipes.bucket_sweep, recipes.memory_sweeps, recipes.strong_scaling,
                 recipes.readiness_cases, recipes.accumulation, recipes.bytes_on_wire):
        made = make()
        exps = [e for v in made.values() for e in v] if isinstance(made, dict) else made
        for e in exps if isinstance(exps, list) else [exps]:
            check_launch([e])


@pytest.mark.parametrize("model", ["branchy", "tests.support.user_models:with_frozen"])
def test_activations_of_a_model_the_lab_cannot_count_are_measured_and_refused_when_too_big(model):
    """No formula covers branchy or a user's model: one forward of two examples measures what autograd
    saves per example, so a huge local batch is refused before launch (`ddplab audit
    --local-batch 100000` ran past 150 s)."""
    from ddplab.launch.preflight import measured_activations

    small = Experiment(model=model, world_size=2, local_batch=4, seq_len=16)
    per_example = measured_activations(small)
    assert per_example > 0
    assert check_launch([small]) == ("gloo", "cpu")
    with pytest.raises(ValueError, match=r"^Experiment\.world_size: 2 ranks .* would need about \d+\.\d GiB"):
        check_launch([small.replace(local_batch=100_000, seq_len=1024)])


def test_a_cgroup_memory_limit_is_what_is_available(tmp_path):
    from ddplab.launch.preflight import memory_available

    (tmp_path / "memory.max").write_text(f"{3 * 2 ** 30}\n")
    (tmp_path / "memory.current").write_text(f"{2 ** 30}\n")
    have, where = memory_available(str(tmp_path))
    assert have == 2 * 2 ** 30 and where == "this process's cgroup leaves"
    (tmp_path / "memory.max").write_text("max\n")
    assert memory_available(str(tmp_path))[1] == "this machine has"
