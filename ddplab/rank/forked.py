"""A rank forked from torchrun's agent, the default on a machine without a GPU (`launch.loopback.forks_ranks`).

torchrun starts every rank as a new interpreter (`python -u -m ddplab.rank.worker ...`), and each pays
for `import torch` and `torch._dynamo` again: about 3 CPU-seconds, more than a small experiment's whole
run. ddplab's agent has them imported already, so it forks each rank from itself (`fork_rank`, in place of
torchrun's `Popen`) and the rank is the process torchrun would have started: a child of the agent, in a
session of its own, with the environment and output files torchrun gives it, its exit code or signal
read by the agent as torchrun reads a rank's. Only its command line differs: it is the agent's, so the
rank names itself (`processes.name_rank`) and the process rules tell them apart by that name. Python's
string hash seed is the agent's too ($PYTHONHASHSEED cannot change in a running process): every rank
iterates a set of strings in the same order, as ranks exec'd with one $PYTHONHASHSEED would.
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
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:   # reaped elsewhere: its status is lost, and Popen says 0 then too
                pid, status = self.pid, 0
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
    process torchrun would start, forked from this agent, where torch, torch._dynamo and the worker are
    imported already. Returned once the rank has its own session, torchrun's environment and output files,
    unbuffered streams and none of the agent's signal handlers or file descriptors; the rank leaves by
    `os._exit`, as the worker does, and never returns into the agent's code."""
    for f in (sys.stdout, sys.stderr):
        f.flush()
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            try:
                os.close(ready_r)
                _become_rank(handler, env, ready_w)
                from . import worker

                sys.argv = [worker.__file__, *args[4:]]
                code = worker.run(list(args[4:]))
            except SystemExit as e:   # as the interpreter would leave
                if e.code is None or isinstance(e.code, int):
                    code = e.code or 0
                else:
                    print(e.code, file=sys.stderr)
            except BaseException:  # noqa: BLE001 - as the interpreter would: the traceback, then exit code 1
                import traceback

                traceback.print_exc()
            finally:
                for f in (sys.stdout, sys.stderr):
                    f.flush()
        finally:
            os._exit(code)
    os.close(ready_w)
    os.read(ready_r, 1)   # the rank is in its own session (torchrun may stop its process group from now on)
    os.close(ready_r)
    return ForkedRank(pid, args)


def _become_rank(handler, env: dict, ready_w: int) -> None:
    """In the forked child: leave the agent behind, then say so on `ready_w`."""
    import faulthandler
    import gc
    import io
    import signal

    from .. import processes

    gc.freeze()   # the agent's objects are never collected here, so none closes a descriptor the rank reuses
    faulthandler.disable()   # torchrun's @record enabled it in the agent; the worker arms its own
    os.setsid()   # torchrun's start_new_session: the agent stops a rank with its process group
    for fd, f in ((1, handler._stdout), (2, handler._stderr)):
        if f is not None:
            os.dup2(f.fileno(), fd)
    # nothing of the agent's but its standard streams, as torchrun's Popen closes the rest: no copy of its
    # stores' sockets may keep them open (or their peers waiting) once the agent is gone
    os.closerange(3, ready_w)
    os.closerange(ready_w + 1, os.sysconf("SC_OPEN_MAX"))
    for sig in signal.valid_signals():   # torchrun's handlers (TORCHELASTIC_SIGNALS_TO_HANDLE), any other
        if callable(signal.getsignal(sig)) and sig != signal.SIGINT:
            signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ.clear()
    os.environ.update(env)
    processes.name_rank(env.get("RANK", ""))
    # `python -u`: text written through to the descriptor at once (a rank that is killed loses nothing it
    # printed); the agent's stream objects are kept, or freeing them would close descriptors 1 and 2
    _AGENTS_STREAMS.extend((sys.stdout, sys.stderr))
    for name, fd in (("stdout", 1), ("stderr", 2)):
        old = getattr(sys, name)
        new = io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding=old.encoding, errors=old.errors,
                               write_through=True)
        setattr(sys, name, new)
        setattr(sys, f"__{name}__", new)
    if "numpy" in sys.modules:   # seeded once, in the agent, as torch._dynamo imported it: each rank its own
        sys.modules["numpy"].random.seed()
    os.write(ready_w, b"1")
    os.close(ready_w)


_AGENTS_STREAMS: list = []
