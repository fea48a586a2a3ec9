"""A run on one machine listens on loopback only: torchrun's two rendezvous
stores (`launch.loopback`) and the ranks' gloo sockets (`worker_env`)."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from ddplab import host
from ddplab.launch import loopback, torchrun
from tests.support import leftovers

LAUNCHER = textwrap.dedent("""
    import os
    import ddplab
    exp = ddplab.Experiment(name="listen", world_size=2, steps=10_000, local_batch=8, timeout_s=60)
    ddplab.run(exp, os.environ["RUN_DIR"], progress=False)
""")


def _listening(run_dir) -> dict[int, list]:
    """pid -> the addresses its TCP sockets listen on, for every process of this launch."""
    needles = (str(run_dir), f"{run_dir.parent}/.{run_dir.name}.")
    found = {}
    for p in psutil.process_iter(["cmdline"]):
        if any(n in " ".join(p.info["cmdline"] or []) for n in needles):
            try:
                found[p.pid] = [c.laddr for c in p.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN]
            except psutil.Error:
                pass
    return found


def test_the_launch_command_binds_the_rendezvous_to_loopback():
    argv = torchrun.torchrun_argv(2, [], python="py")
    assert argv[:3] == ["py", "-m", "ddplab.launch.loopback"]
    assert "--standalone" not in argv
    assert f"--rdzv-backend={loopback.BACKEND}" in argv and "--local-addr=127.0.0.1" in argv


def test_the_ranks_sockets_stay_on_the_loopback_interface():
    env = torchrun.worker_env({})
    assert env["GLOO_SOCKET_IFNAME"] == host.loopback_interface() and env["NCCL_SOCKET_IFNAME"] == host.loopback_interface()
    assert torchrun.worker_env({"GLOO_SOCKET_IFNAME": "eth7"})["GLOO_SOCKET_IFNAME"] == "eth7"  # the caller's choice wins
    # unshared, the ranks' store would be hosted by rank 0 on every interface, on a port found by bind-and-close
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in torchrun.worker_env({"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"})


def test_a_loopback_store_listens_on_127_0_0_1_only_and_serves_a_client():
    import torch.distributed as dist

    server = loopback.loopback_store(timeout_s=10)
    server.set("k", "v")
    client = dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=__import__("datetime").timedelta(seconds=10))
    assert client.get("k") == b"v"
    mine = [c.laddr for c in psutil.Process().net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == server.port]
    assert [a.ip for a in mine] == ["127.0.0.1"], mine


@pytest.mark.slow
@pytest.mark.parametrize("nodes", ["1", "2"])   # 2: two torchrun agents on this host, one rendezvous (launch.nodes)
def test_a_live_run_listens_on_loopback_only(tmp_path, nodes):
    run_dir = tmp_path / "listen"
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER],
                                env={**os.environ, "RUN_DIR": str(run_dir), "DDPLAB_NODES": nodes},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        seen: dict[int, list] = {}
        # torchrun's agent (2 stores) and both ranks (gloo) listen once the ranks are training
        while time.monotonic() < deadline and sum(bool(v) for v in seen.values()) < 3:
            time.sleep(0.5)
            seen = _listening(run_dir)
        assert sum(bool(v) for v in seen.values()) >= 3, f"never saw the agent and 2 ranks listening: {seen}"
        addrs = [a for v in seen.values() for a in v]
        assert len(addrs) >= 4, addrs
        public = [a for a in addrs if not ipaddress.ip_address(a.ip).is_loopback]
        assert public == [], f"listening beyond loopback: {public} (all: {addrs})"
    finally:
        launcher.kill()
        launcher.wait()
        deadline = time.monotonic() + 10
        while leftovers(run_dir) and time.monotonic() < deadline:
            time.sleep(0.2)
    assert leftovers(run_dir) == []
