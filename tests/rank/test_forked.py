"""How a rank comes to be (`rank/forked.py`): forked from torchrun's agent, with torch imported already (the
default on a machine without a GPU, `launch.loopback.forks_ranks`), or started as a new interpreter ($DDPLAB_RANK_START=exec,
as torchrun starts a script and as a GPU machine starts ranks). Either way the ranks are the same ranks:
children of the agent, told apart from it, training bit for bit the same."""

from __future__ import annotations

import inspect
import re
import threading
import time

import psutil
import pytest
import torch

import ddplab
from ddplab import processes
from ddplab.launch import loopback
from ddplab.rank import forked
from ddplab.spec import Experiment, Straggler
from tests.support import saved_tensors


def test_torchs_agent_starts_every_rank_through_the_one_method_ddplab_replaces():
    # read from the running torch: the agent makes one SubprocessHandler per rank, which calls its `_popen(args,
    # env)` once, with the output files torchrun opened for that rank; the agent then uses only these of the
    # object `_popen` returns (what `forked.ForkedRank` provides)
    from torch.distributed.elastic.multiprocessing import api
    from torch.distributed.elastic.multiprocessing.subprocess_handler import SubprocessHandler

    assert list(inspect.signature(SubprocessHandler._popen).parameters) == ["self", "args", "env"]
    init = inspect.getsource(SubprocessHandler.__init__)
    assert "self.proc" in init and "self._popen(" in init and "self._stdout" in init and "self._stderr" in init
    assert "get_subprocess_handler(" in inspect.getsource(api.SubprocessContext._start)
    used = set(re.findall(r"\.proc\.(\w+)", inspect.getsource(api.SubprocessContext)))
    used |= set(re.findall(r"\.proc\.(\w+)", inspect.getsource(SubprocessHandler)))
    assert used and used <= {"pid", "poll", "wait", "send_signal", "kill", "returncode"}, used
    assert all(callable(getattr(forked.ForkedRank, m)) for m in used - {"pid", "returncode"})


def test_only_ddplabs_own_worker_is_forked(monkeypatch):
    monkeypatch.delenv(loopback.RANK_START_ENV, raising=False)
    worker = ["--nnodes=1", "-m", processes.WORKER, "--spec", "x/spec.json"]
    script = ["--nnodes=1", "train.py", "-m", processes.WORKER]   # a script's own argument, not torchrun's -m
    assert loopback.forks_ranks(worker) == (not torch.cuda.is_available())
    assert not loopback.forks_ranks(script) and not loopback.forks_ranks(["-m", "my.module"])
    monkeypatch.setenv(loopback.RANK_START_ENV, "exec")
    assert not loopback.forks_ranks(worker)


def test_a_forked_child_leaves_the_agent_behind(tmp_path):
    """`_become_rank` in a child forked from this process: its own session, name and environment; none of
    this process's signal handlers, file descriptors, faulthandler or numpy seed; and output that reaches
    its file though the child is SIGKILLed right after printing (as with `python -u`)."""
    import faulthandler
    import json
    import os
    import signal
    import socket
    import types

    import numpy as np

    out = tmp_path / "rank.out"
    handler = types.SimpleNamespace(_stdout=open(out, "w"), _stderr=None)
    held = socket.socket()   # a descriptor of the "agent" the child must not keep
    previous = signal.signal(signal.SIGUSR1, lambda *_: None)
    faulthandler.enable()
    env = {"RANK": "5", "ONLY": "this"}
    ready_r, ready_w = os.pipe()
    try:
        pid = os.fork()
        if pid == 0:
            try:
                os.close(ready_r)
                forked._become_rank(handler, env, ready_w)
                fds = [int(f) for f in os.listdir("/proc/self/fd")]
                print(json.dumps({
                    "sid": os.getsid(0) == os.getpid(), "name": open("/proc/self/comm").read().strip(),
                    "env": dict(os.environ), "held": held.fileno() in fds, "above_2": len([f for f in fds if f > 2]),
                    "handlers": [int(s) for s in signal.valid_signals()
                                 if callable(signal.getsignal(s)) and s != signal.SIGINT],
                    "faulthandler": faulthandler.is_enabled(), "draw": float(np.random.random())}))
                os.kill(os.getpid(), signal.SIGKILL)   # no flush, no exit: what was printed must be in the file
            finally:
                os._exit(3)
        os.close(ready_w)
        assert os.read(ready_r, 1) == b"1"   # said once it had left the agent behind
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == -signal.SIGKILL
        parent_draw = float(np.random.random())
    finally:
        os.close(ready_r)
        signal.signal(signal.SIGUSR1, previous)
        faulthandler.disable()
        handler._stdout.close()
        held.close()
    seen = json.loads(out.read_text())
    assert seen["sid"] and seen["name"] == "ddplab-rank-5" and seen["env"] == env, seen
    assert not seen["held"] and seen["above_2"] <= 1, seen   # at most the descriptor listing /proc/self/fd
    assert seen["handlers"] == [] and not seen["faulthandler"], seen
    assert seen["draw"] != parent_draw, seen   # numpy reseeded: not the draw this process's state gives next


def _watch(where: str, seen: list, stop: threading.Event) -> None:
    """Record (name, module, parent's module) of every process of the run under `where` until `stop`."""
    while not stop.is_set():
        for p in processes.with_cmdline((where,)):
            try:
                parent = p.parent()
                seen.append((p.name(), processes._module(p.cmdline()), processes._module(parent.cmdline()),
                             processes.rank_of_name(parent)))
            except psutil.Error:
                pass
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine with a GPU starts every rank as a new interpreter")
def test_forked_and_execd_ranks_are_children_of_the_agent_and_train_bit_for_bit_the_same(tmp_path, monkeypatch):
    runs, seen = {}, {}
    for mode in ("fork", "exec"):
        monkeypatch.setenv(loopback.RANK_START_ENV, mode)
        out = tmp_path / mode
        exp = Experiment(name="start", world_size=2, steps=4, local_batch=4, probes=("gradients",),
                         straggler=Straggler(rank=0, where="data", ms=300.0))   # long enough to be seen
        seen[mode], stop = [], threading.Event()
        watcher = threading.Thread(target=_watch, args=(str(tmp_path), seen[mode], stop), daemon=True)
        watcher.start()
        try:
            runs[mode] = ddplab.run(exp, out, progress=False, warm=False)
        finally:
            stop.set()
            watcher.join(timeout=10)
    agent = "ddplab.launch.loopback"
    forked = {s for s in seen["fork"] if s[0].startswith(processes.RANK_NAME)}
    # each forked rank is named with its RANK, runs the agent's command line, and its parent is the agent
    assert {s[0] for s in forked} == {"ddplab-rank-0", "ddplab-rank-1"}, seen["fork"]
    assert all(s[1] == agent and s[2] == agent and s[3] is None for s in forked), forked
    # an exec'd rank runs the worker module, under the agent, and nothing is named as a forked rank
    execd = {s for s in seen["exec"] if s[1] == processes.WORKER}
    assert execd and all(s[2] == agent for s in execd), seen["exec"]
    assert not any(s[0].startswith(processes.RANK_NAME) for s in seen["exec"]), seen["exec"]
    # the same training: losses and every gradient each rank saved, bit for bit
    a, b = runs["fork"], runs["exec"]
    assert a.global_loss() == b.global_loss()
    saved_a, saved_b = saved_tensors(a), saved_tensors(b)
    assert len(saved_a) == len(saved_b) == 2
    for ta, tb in zip(saved_a, saved_b):
        assert ta.keys() == tb.keys() and ta
        assert all(torch.equal(ta[k], tb[k]) for k in ta)
