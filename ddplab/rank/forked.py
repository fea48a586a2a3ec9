"""A rank forked from torchrun's agent, the default on a machine without a GPU (`launch.loopback.forks_ranks`).

torchrun starts every rank as a new interpreter (`python -u -m ddplab.rank.worker ...`), and each pays
for `import torch` and `torch._dynamo` again: about 3 CPU-seconds, more than a small experiment's whole
run. ddplab's agent has them imported already, so it forks each rank from itself (`fork_rank`, in place of
torchrun's `Popen`) and the rank is the process torchrun would have started: a child of the agent, in a
session of its own, with the environment and output files torchrun gives it, its exit code or signal
read by the agent as torchrun reads a rank's. Only its command line differs: it is the agent's, so the
rank names itself (`processes.name_rank`) and the process rules tell them apart by that name.
`python bench/launch_cost.py` measures both starts side by side. A user's script is never forked: torchrun
starts it as it always does.
Runs in torchrun's agent, then in the rank it forks.
"""

from __future__ import annotations

import os
import sys


class ForkedRank:
    """What torchrun's agent keeps of a rank it started (`subprocess.Popen`'s pid, poll, wait, send_signal,
    kill), for a rank forked from the agent."""

    def __init__(self, pid: int, args):
        self.pid, self.args, self.returncode = pid, list(args), None

    def poll(self):
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        import subprocess
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.01)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        import signal

        self.send_signal(signal.SIGKILL)


def fork_rank(handler, args: tuple, env: dict) -> ForkedRank:
    """torchrun's `SubprocessHandler._popen` for ddplab's worker (`python -u -m ddplab.rank.worker ...`): the
    same process torchrun would start (its own session, the environment and output files torchrun gives
    it, the agent's signal handlers left behind, unbuffered output), forked from this agent, where torch,
    torch._dynamo and the worker are imported already, so a rank starts in a fraction of the CPU-seconds of
    a new interpreter (`python bench/launch_cost.py`). Its command line is the agent's; its name
    (`processes.RANK_NAME`) says it is a rank. It leaves by `os._exit`, as the worker does."""
    import signal
    import traceback

    from .. import processes
    from . import worker

    for f in (sys.stdout, sys.stderr):
        f.flush()
    pid = os.fork()
    if pid:
        return ForkedRank(pid, args)
    code = 1
    try:
        os.setsid()   # torchrun's start_new_session: the agent stops a rank with its process group
        for fd, f in ((1, handler._stdout), (2, handler._stderr)):
            if f is not None:
                os.dup2(f.fileno(), fd)
        # nothing of the agent's but its standard streams, as torchrun's Popen closes the rest: no copy of
        # its stores' sockets may keep them open (or their peers waiting) once the agent is gone
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.environ.clear()
        os.environ.update(env)
        processes.name_rank(env.get("RANK", ""))
        sys.stdout.reconfigure(write_through=True)
        sys.stderr.reconfigure(write_through=True)
        sys.argv = [worker.__file__, *args[4:]]
        code = worker.run(list(args[4:]))
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 - as the interpreter would: the traceback, then exit code 1
        traceback.print_exc()
    finally:
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(code)
