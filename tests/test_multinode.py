"""Several nodes (issue 18, item 3): the launch command for N torchrun agents meeting at a c10d
rendezvous, tested with two agents on this host as two "nodes"; event times aligned on a barrier."""

from __future__ import annotations

import torch
import pytest

import ddplab
from ddplab import failures
from ddplab.launch import nodes as nodes_mod
from ddplab.launch import torchrun
from ddplab.launch.nodes import Nodes
from ddplab.spec import Experiment
from ddplab.spec.fault import Fault
from tests.conftest import leftovers


# ---- the command (pure) --------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, field", [({"count": 0}, "node count"), ({"count": 2.0}, "node count"),
                                           ({"count": True}, "node count"), ({"launcher": "mpirun"}, "launcher"),
                                           ({"endpoint": "head"}, "endpoint"), ({"endpoint": "head:0"}, "endpoint")])
def test_bad_nodes_are_refused_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"nodes: .*{field}"):
        Nodes(**kwargs)


@pytest.mark.parametrize("value", ["0", "two", "-1", "1.5"])
def test_a_bad_DDPLAB_NODES_is_refused_before_anything_starts(value, monkeypatch, tmp_path):
    with pytest.raises(ValueError, match="DDPLAB_NODES"):
        Nodes.from_env({"DDPLAB_NODES": value})
    monkeypatch.setenv("DDPLAB_NODES", value)
    with pytest.raises(ValueError, match="DDPLAB_NODES"):
        ddplab.run(Experiment(world_size=2, steps=1), tmp_path / "never", progress=False, warm=False)
    assert not (tmp_path / "never").exists()


def test_from_env_reads_count_launcher_and_endpoint():
    assert Nodes.from_env({}) == Nodes(1)
    assert Nodes.from_env({"DDPLAB_NODES": "4", "DDPLAB_NODE_LAUNCHER": "srun", "DDPLAB_RDZV_ENDPOINT": "n1:29400"}) \
        == Nodes(4, "srun", "n1:29400")


@pytest.mark.parametrize("count, world, per_node, total", [(1, 4, 4, 4), (2, 4, 2, 4), (2, 3, 2, 4), (4, 2, 1, 4),
                                                         (3, 8, 3, 9)])
def test_ranks_are_spread_evenly_rounding_up(count, world, per_node, total):
    n = Nodes(count)
    assert (n.per_node(world), n.total(world)) == (per_node, total)
    assert n.ranks_here(world) == total                      # simulated: every node is this host
    assert Nodes(count, "srun").ranks_here(world) == per_node  # srun: one node's share is here


def test_one_node_is_the_single_agent_command():
    argv = torchrun.torchrun_argv(4, ["--spec", "s.json"], python="py", nodes=Nodes(1))
    assert argv[:3] == ["py", "-m", "ddplab.launch.loopback"]
    assert "--nnodes=1" in argv and "--nproc-per-node=4" in argv and argv[-2:] == ["--spec", "s.json"]


def test_simulated_nodes_are_agents_of_one_rendezvous_on_loopback():
    argv = torchrun.torchrun_argv(4, ["--spec", "s.json"], python="py", nodes=Nodes(2))
    assert argv[:4] == ["py", "-m", "ddplab.launch.nodes", "--agents=2"]
    assert "--nnodes=2" in argv and "--nproc-per-node=2" in argv and "--local-addr=127.0.0.1" in argv
    host_flags = nodes_mod._agent_flags(argv[5:], 4242, listen_fd=7)
    guest_flags = nodes_mod._agent_flags(argv[5:], 4242, listen_fd=None)
    for flags in (host_flags, guest_flags):   # every agent meets at the one endpoint
        assert "--rdzv-endpoint=127.0.0.1:4242" in flags and flags[-2:] == ["--spec", "s.json"]
    assert any(f.startswith("--rdzv-conf=") and "listen_fd=7" in f and "join_timeout=" in f for f in host_flags)
    assert not any("listen_fd" in f for f in guest_flags)


def test_srun_starts_one_agent_per_node_at_a_c10d_rendezvous():
    argv = torchrun.torchrun_argv(8, ["--spec", "s.json"], python="py", nodes=Nodes(2, "srun", "head:29400"))
    assert argv[0] == "srun" and "--ntasks-per-node=1" in argv and "--nodes=2" in argv
    i = argv.index("torch.distributed.run")
    assert argv[i - 2:i] == ["py", "-m"]
    assert {"--nnodes=2", "--nproc-per-node=4", "--rdzv-backend=c10d", "--rdzv-endpoint=head:29400"} <= set(argv)
    # on several machines the ranks' sockets must reach the other nodes: not pinned to loopback
    env = torchrun.worker_env({"PATH": "/bin"}, nodes=Nodes(2, "srun"))
    assert "GLOO_SOCKET_IFNAME" not in env and "NCCL_SOCKET_IFNAME" not in env
    assert torchrun.worker_env({"PATH": "/bin"}, nodes=Nodes(2))["GLOO_SOCKET_IFNAME"]   # simulated: loopback


# ---- real launches: 2 agents x 2 ranks against 1 agent x 4 ----------------------------------------
def _exp(**kw):
    return Experiment(**{"name": "nodes", "world_size": 4, "steps": 2, "local_batch": 4, "probes": ("buckets", "gradients"),
                         "bucket_cap_mb": 0.25, **kw})


def _final(run) -> list[dict]:
    """Every tensor each rank saved (its local and reduced gradients of each step), by a flat name."""
    def flat(d, prefix=""):
        for k, v in d.items():
            yield from flat(v, f"{prefix}{k}/") if isinstance(v, dict) else [(prefix + str(k), v)]
    return [dict(flat(run.tensors(r))) for r in range(run.world_size)]


@pytest.mark.slow
def test_two_nodes_of_two_ranks_give_what_one_node_of_four_gives(tmp_path, monkeypatch):
    one = ddplab.run(_exp(), tmp_path / "one", progress=False, warm=False)
    monkeypatch.setenv("DDPLAB_NODES", "2")
    # node 1's clock reads 1000 s later than node 0's, as two machines' clocks disagree
    monkeypatch.setenv("DDPLAB_NODE_CLOCK_SKEW_S", "1000")
    two = ddplab.run(_exp(), tmp_path / "two", progress=False, warm=False)
    assert "--nnodes=2" in two.launch["argv"] and two.launch["nodes"] == {"count": 2, "launcher": "local"}
    # ranks 0-1 on one node, 2-3 on the other (torchrun hands out ranks node by node)
    node_of = [r.envelope.node for r in two.ranks]
    assert sorted(set(node_of)) == [0, 1] and node_of[0] == node_of[1] != node_of[2] == node_of[3], node_of
    assert {r.envelope.node for r in one.ranks} == {0}
    # the same training: losses, and every tensor a rank saved, bit for bit
    assert two.global_loss() == one.global_loss()
    for a, b in zip(_final(one), _final(two)):
        assert a.keys() == b.keys() and a
        for k in a:
            assert torch.equal(a[k], b[k]), k
    # the skew is real (the raw clocks at the barrier are 1000 s apart) and gone from the events
    at = {r.envelope.node: r.envelope.aligned_at_ns for r in two.ranks}
    assert abs(abs(at[1] - at[0]) - 1000e9) < 1e9, at
    for step in range(2):   # each bucket's all-reduce ends at about the same moment on every rank
        done = [max(b.done_ns for b in r.steps[step].buckets) for r in two.ranks]
        assert max(done) - min(done) < 0.5e9, done


@pytest.mark.slow
def test_nodes_that_do_not_divide_the_ranks_leave_the_extra_rank_out(tmp_path, monkeypatch):
    one = ddplab.run(_exp(world_size=3, steps=1), tmp_path / "one", progress=False, warm=False)
    monkeypatch.setenv("DDPLAB_NODES", "2")
    two = ddplab.run(_exp(world_size=3, steps=1), tmp_path / "two", progress=False, warm=False)
    assert "--nproc-per-node=2" in two.launch["argv"] and two.world_size == 3
    assert two.global_loss() == one.global_loss()


@pytest.mark.slow
def test_a_failing_rank_on_the_second_node_is_named_and_nothing_survives(tmp_path, monkeypatch):
    monkeypatch.setenv("DDPLAB_NODES", "2")
    with pytest.raises(failures.RunFailed) as err:
        ddplab.run(_exp(fault=Fault("crash", rank=3, step=1), timeout_s=20), tmp_path / "crash",
                   progress=False, warm=False)
    d = err.value.diagnosis
    assert d.kind == "crash" and d.ranks == [3], (d.kind, d.ranks)
    assert "Traceback" in str(err.value) and "rank 3" in str(err.value)
    assert leftovers(tmp_path / "crash") == []


@pytest.mark.slow
def test_a_session_spans_two_nodes_and_runs_jobs_as_a_cold_launch_does(tmp_path, monkeypatch):
    cold = ddplab.run(_exp(steps=1), tmp_path / "cold", progress=False, warm=False)
    monkeypatch.setenv("DDPLAB_NODES", "2")
    with ddplab.Session(world_size=3, runs_dir=tmp_path) as s:   # 3 ranks fill 2 nodes as 2 x 2
        assert s.world_size == 4 and "--nnodes=2" in s.argv
        warm = ddplab.run(_exp(steps=1), tmp_path / "warm", progress=False)
        assert warm.launch["session"] == s.dir.name and warm.launch["nodes"] == {"count": 2, "launcher": "local"}
    assert warm.global_loss() == cold.global_loss()
    assert sorted({r.envelope.node for r in warm.ranks}) == [0, 1]
