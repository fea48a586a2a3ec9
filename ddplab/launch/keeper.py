"""The keeper: the one process between the launcher and torchrun, that no process of the run outlives.

    python ddplab/launch/keeper.py --owner <launcher pid> [--tmp DIR] [--report FILE] [--orphaned-remove DIR] -- <argv>

The lab's own ranks die with torchrun (`processes.die_with_parent`), but what else a run starts does not: a
user's script's ranks (torchrun starts each in a session of its own), and whatever a `%%ddp` cell, a
script or a model factory starts, in a new session or not. The keeper is their subreaper
(PR_SET_CHILD_SUBREAPER): a process of the run that loses its parent is re-parented to the keeper, not
to init, so everything the run started stays beneath it. It dies with the launcher (PR_SET_PDEATHSIG,
as SIGTERM so it can act) and then kills everything beneath it; when torchrun ends by itself, it kills
what is still left and names those processes in `--report` (JSON) and on stderr, and exits with
torchrun's status. The launcher stops a run (`torchrun.kill_tree`) with STOP_SIGNAL: the keeper kills
torchrun and its ranks, then what they started (named in `--report`), removes its folder, and ends as
SIGKILL ends a process. Every process of the run carries `DDPLAB_OWNER` (a token of this launch) in its
environment, which finds one that a subreaper of its own took out of the tree.

torchrun and the ranks get a temporary folder of the run's own (`--tmp`, which the launcher made and
removes too if the keeper could not; $TMPDIR: torchrun's `torchelastic_*` log folder, a compiler's temp
files) that the keeper removes when it ends; inductor's cache stays where it was.
Its process rules (the owner token, die-with-parent, the subreaper, killing) are `processes.py`'s. Run as
a script it loads that one file by its path, not the ddplab package, and no torch (stdlib and psutil),
so it starts in a fraction of a second.
Started by `launch.torchrun.start` for every local launch: cold runs, sessions, `run_script`.
"""

from __future__ import annotations

import contextlib
import getpass
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
import warnings

if __package__:   # imported as ddplab.launch.keeper: by the launcher, for the names below
    from .. import processes
else:   # run as a script (`launch.torchrun.start`): the one file of the process rules, not the ddplab package
    _spec = importlib.util.spec_from_file_location(
        "ddplab_processes", os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "processes.py"))
    processes = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(processes)

OWNER_ENV = processes.OWNER_ENV
STOP_SIGNAL = signal.SIGUSR1   # the launcher's "stop the run now" (`torchrun.kill_tree`)
POLL_S = 0.05
# inductor's compile-worker sidecar (and its pool) of a rank that ended with os._exit, skipping torch's
# atexit shutdown: it ends by itself once it reads the end of its pipe, maybe after the sweep; not named
COMPILE_WORKER = "torch._inductor.compile_worker"
REPORT = "left-running.json"   # the usual name of `--report` in a run's folder


def kill_all(token: str) -> list[dict]:
    """SIGKILL every process `owned` by this run until none is left, and reap them; what was found first."""
    return processes.kill_until_gone(lambda: processes.owned(token), processes.reap)


def run_env(env: dict, tmp: str) -> dict:
    """torchrun's environment: the temporary folder is the keeper's; inductor's cache stays where torch
    would put it without that (it is worth keeping from run to run)."""
    env = dict(env)
    if "TORCHINDUCTOR_CACHE_DIR" not in env:
        try:
            user = getpass.getuser()
        except (KeyError, OSError):
            user = f"uid_{os.getuid()}"
        env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tempfile.gettempdir(), "torchinductor_" + user.replace("/", "_"))
    env["TMPDIR"] = tmp
    return env


@contextlib.contextmanager
def children_stopped(what: str):
    """Run the block (a user's factory building and running its model in the launcher's own process,
    `launch.preflight`), then stop every process it started and left running, and warn naming them:
    the new children of this process and their descendants, and what carries a token that this
    process's environment holds while the block runs. Processes that already ran (a pool's workers)
    and what they start stay; a launch that another thread starts meanwhile carries its own token
    (`launch.torchrun.start`) and is left alone."""
    import psutil

    me = psutil.Process()
    before = {(p.pid, processes.start_ticks(p.pid)) for p in me.children()}   # a recycled pid is another process
    token, outer = f"preflight-{uuid.uuid4().hex}", os.environ.get(OWNER_ENV)
    os.environ[OWNER_ENV] = token
    try:
        yield
    finally:
        if outer is None:
            os.environ.pop(OWNER_ENV, None)
        else:
            os.environ[OWNER_ENV] = outer

        def started() -> list:
            found = {}
            for child in me.children():
                if (child.pid, processes.start_ticks(child.pid)) not in before and _not_another_launch(child, token):
                    found[child.pid] = child
                    with contextlib.suppress(psutil.Error):
                        found.update({p.pid: p for p in child.children(recursive=True)})
            found.update({p.pid: p for p in processes.marked(token)})
            return list(found.values())

        left = [d["cmdline"] for d in processes.kill_until_gone(started)]
        if left:
            warnings.warn(f"{what} started {len(left)} process(es) that were still running after it was built and "
                          f"checked here; " + stopped(left), stacklevel=3)


def _not_another_launch(p, token: str) -> bool:
    import psutil

    try:
        return p.environ().get(OWNER_ENV) in (None, token)
    except psutil.Error:
        return True


def stopped(cmdlines) -> str:
    """'they were stopped: ' and the command lines, each cut at 200 characters (every such message's end)."""
    return "they were stopped: " + "; ".join(c[:200] for c in cmdlines)


def left_running(report) -> list[str]:
    """The command lines a keeper's `--report` names (what a run that ended left running), or []."""
    try:
        return [d["cmdline"] for d in json.loads(open(report).read())]
    except (OSError, ValueError, TypeError, KeyError):
        return []


def warn_left(report, who: str, stacklevel: int = 3) -> list[str]:
    """`left_running(report)`, said in a warning when there is any: `who` ended with them still running."""
    left = left_running(report)
    if left:
        warnings.warn(f"{who} ended with {len(left)} process(es) it started still running; " + stopped(left),
                      stacklevel=stacklevel)
    return left


def _parse(argv: list[str]) -> dict:
    at = argv.index("--")
    opts = {"owner": None, "tmp": None, "report": None, "orphaned-remove": [], "command": argv[at + 1:]}
    flags = argv[:at]
    for i in range(0, len(flags), 2):
        name = flags[i].removeprefix("--")
        if name == "orphaned-remove":
            opts[name].append(flags[i + 1])
        else:
            opts[name] = flags[i + 1]
    return opts


def _torchrun_and_ranks(child) -> list:
    """torchrun and its children (the ranks): what a stopped run is expected to have running."""
    import psutil

    try:
        root = psutil.Process(child.pid)
        return [root, *root.children()]
    except psutil.Error:
        return []


def main(argv: list[str]) -> int:
    opts = _parse(argv)
    stopping: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, STOP_SIGNAL):   # before anything starts: none is lost
        signal.signal(sig, lambda signum, frame: stopping.append(signum))
    processes.become_subreaper()
    owner = int(opts["owner"]) if opts["owner"] else None
    token = os.environ.get(OWNER_ENV) or f"keeper-{os.getpid()}"
    tmp = opts["tmp"] or tempfile.mkdtemp(prefix="ddplab-run-")
    child, code = None, 128 + signal.SIGTERM
    try:
        if owner is None or os.getppid() == owner:   # the launcher may have died before the death signal was armed
            child = subprocess.Popen(opts["command"], env=run_env({**os.environ, OWNER_ENV: token}, tmp),
                                     preexec_fn=processes.die_with_parent)
        while child is not None and not stopping and (owner is None or os.getppid() == owner):
            try:
                child.wait(timeout=POLL_S)
                break
            except subprocess.TimeoutExpired:
                processes.reap(keep=child.pid)
        orphaned = owner is not None and os.getppid() != owner   # the launcher is gone (not just a signal here)
        if child is not None and child.returncode is None:   # stopped: the run itself first, then what it started
            processes.kill_until_gone(lambda: _torchrun_and_ranks(child), processes.reap)
        elif child is not None:
            code = child.returncode
        left = [d for d in kill_all(token) if COMPILE_WORKER not in d["lineage"]]   # a pool's, ending on its own
        if left and not orphaned:   # the run left these running: say so (its owner reads `--report`)
            print(f"ddplab: the run ended with {len(left)} process(es) it started still running; "
                  + stopped(f"pid {d['pid']}: {d['cmdline']}" for d in left), file=sys.stderr, flush=True)
            try:
                if opts["report"]:
                    with open(opts["report"], "w") as f:
                        json.dump([{"pid": d["pid"], "cmdline": d["cmdline"]} for d in left], f)
            except OSError:   # the run's folder is gone: torchrun's status still says how it ended
                pass
        if orphaned:
            for d in opts["orphaned-remove"]:
                shutil.rmtree(d, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if STOP_SIGNAL in stopping:   # the launcher stopped the run: it reads the status a SIGKILL gives, as it always has
        os.kill(os.getpid(), signal.SIGKILL)
    if code < 0:   # torchrun killed by a signal: so is the keeper, and the launcher sees the same status
        if -code in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):   # the ones it catches
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        time.sleep(1)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
