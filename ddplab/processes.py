"""The lab's rules about processes, in one place: which process is which, whether it lives, finding a
run's processes, the witness signal, and that no process of a run outlives the one that started it.

- identity: `identity(pid)` (boot, pid namespace, start time in clock ticks since boot), `start_ticks`,
  `is_gone(record)` (a recorded owner provably ended: `rundir.owner_gone`);
- liveness: `alive(p)` (a zombie is dead), `is_live_rank(pid, start_ticks)` (a rank of ours, that very one);
- finding a run's processes: `rank_processes` (from the ranks' progress records), `ranks_under(pid)` (a forked
  rank by its name, another by its RANK), `with_cmdline(needles)` / `live_processes(needles)` (by command line),
  `marked(token)` / `owned(token)` (by `OWNER_ENV`, the launch's token in the environment of every process
  a run starts);
- the witness signal: `WITNESS_SIGNAL`, `ask_witnesses` (`rank/witness.py` answers it);
- die with the parent: `die_with_parent` (PR_SET_PDEATHSIG), `parent_is_torchrun`, `become_subreaper`
  (PR_SET_CHILD_SUBREAPER), and ending them: `kill_until_gone`, `reap`.

Everything is read through psutil but a process's start time, boot and pid namespace (`identity`:
psutil has no boot id nor namespace, and its `create_time()` adds the wall clock's boot time, which a
clock step moves). Standard library and psutil only, and no ddplab import: the keeper
(`launch/keeper.py`), which must start in a fraction of a second, loads this one file by its path
without importing the ddplab package (whose import costs more than the keeper's whole start). psutil is
imported on use: a rank calls `die_with_parent` before anything else. Used by the launcher (`launch/`),
the keeper, the ranks (`rank/worker.py`, `rank/witness.py`) and the run directory (`rundir.py`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import sys
import time
from pathlib import Path

PR_SET_PDEATHSIG, PR_SET_NAME, PR_SET_CHILD_SUBREAPER = 1, 15, 36
RANK_NAME = "ddplab-rank-"   # a forked rank's name (/proc/<pid>/comm, 15 characters at most), its RANK after it
OWNER_ENV = "DDPLAB_OWNER"   # the launch's token, inherited by every process the run starts (`launch/keeper.py`)
WORKER = "ddplab.rank.worker"   # the module a rank runs (`-m`)
AGENTS = ("torch.distributed.run", "ddplab.launch.loopback")   # the modules a torchrun agent runs as (`-m`)
WITNESS_SIGNAL = 12   # SIGUSR2 on Linux: only a rank's witness thread takes it (rank/witness.py)
WITNESS_WAIT_S = 1.5   # how long the ranks asked may take to write their testimony before they are stopped
KILL_DEADLINE_S = 15.0   # a tree that forks while it is being killed is killed again, for at most this long


# ---- identity ------------------------------------------------------------------------------------------
def start_ticks(pid: int) -> int | None:
    """When process `pid` started, in clock ticks since boot (field 22 of /proc/<pid>/stat); None if there
    is no such process (or no /proc). Read here, not through psutil: its `create_time()` is these ticks
    plus the boot time in wall-clock seconds, which moves when the clock is stepped (NTP, a suspended
    VM), so a live process would look like another; the ticks never change."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[19])   # field 22, after the command in parentheses
    except (OSError, ValueError, IndexError):
        return None


def identity(pid: int) -> dict | None:
    """What tells process `pid` apart from any other, ever, on this host: the boot it runs in, its pid
    namespace and `start_ticks` (no wall clock, so a clock step cannot make a live process look like
    another). None if there is no such process (or no /proc). psutil reads neither the boot id nor a
    process's pid namespace, so both are read here too."""
    start = start_ticks(pid)
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        pidns = os.readlink(f"/proc/{pid}/ns/pid") if Path(f"/proc/{pid}/ns/pid").exists() else ""
    except OSError:
        return None
    return None if start is None else {"boot": boot, "pidns": pidns, "start_ticks": start}


def is_gone(record: dict) -> bool:
    """True only if the process `record` names (`identity` plus "pid" and "host") is provably gone: it ran on
    this host, in this boot and pid namespace, and no process with its pid has its start time now.
    Another host, boot or namespace we cannot see into: False (it may live)."""
    pid, host, boot, pidns, start = (int(record["pid"]), str(record["host"]), str(record["boot"]),
                                     str(record["pidns"]), int(record["start_ticks"]))
    mine = identity(os.getpid())
    if host != socket.gethostname() or mine is None or (mine["boot"], mine["pidns"]) != (boot, pidns):
        return False
    return start_ticks(pid) != start


# ---- liveness ------------------------------------------------------------------------------------------
def alive(p) -> bool:
    """The psutil process `p` still runs: it exists and is not a zombie (a zombie is dead; its parent reaps it)."""
    import psutil

    try:
        return p.status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.Error:
        return False


def name_rank(rank: str) -> None:
    """Name this process RANK_NAME + rank: a rank forked from torchrun's agent has the agent's command line."""
    _prctl(PR_SET_NAME, f"{RANK_NAME}{rank}".encode()[:15])


def rank_of_name(p) -> str | None:   # psutil.Process `p`
    """The RANK in a forked rank's name, None for any other process."""
    return name[len(RANK_NAME):] if (name := p.name()).startswith(RANK_NAME) else None


def _module(args: list[str]) -> str:
    """The module a Python command line runs (its first `-m`), "" if it runs a script or `-c`."""
    for i, a in enumerate(args[1:-1], start=1):   # the interpreter's options, up to `-m module` (or -c, or a script)
        if a == "-m":
            return args[i + 1]
        if a == "-c" or not a.startswith("-"):
            break
    return ""


def is_live_rank(pid: int, start_ticks_seen: int | None = None) -> bool:
    """`pid` is a living ddplab rank on this host: the module it runs (its first `-m`) is the worker, it is
    not a zombie, and (given the start ticks its progress log recorded) it is that very process. torchrun's
    agent (whose own `-m` is the launcher, the worker coming later) and a process that took over a recycled
    pid are not, so the witness signal never reaches them (it would end them)."""
    import psutil

    if start_ticks_seen is not None and start_ticks(pid) != start_ticks_seen:
        return False
    try:
        p = psutil.Process(pid)
        return alive(p) and (rank_of_name(p) is not None or _module(p.cmdline()) == WORKER)
    except psutil.Error:
        return False


# ---- finding a run's processes -------------------------------------------------------------------------
def rank_processes(last: dict[int, dict]) -> dict[int, tuple]:
    """rank -> (pid, start ticks) of the ranks on this host, from each rank's latest progress record
    (`rundir.ProgressLog` writes its pid, host and `start_ticks`)."""
    here = socket.gethostname()
    return {r: (rec["pid"], rec.get("start_ticks")) for r, rec in last.items()
            if rec and isinstance(rec.get("pid"), int) and rec.get("host", here) == here}


def ranks_under(pid: int, module: str | None = None) -> dict[int, int]:
    """rank -> pid of the ranks beneath `pid` (torchrun's agent), found before their first progress record;
    `module`: only those whose command line holds it (a rank's children inherit its RANK); each read alone."""
    import psutil

    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return {}
    found = {}
    for p in children:
        try:
            # a forked rank: its environment and command line are the agent's, its name is its own
            ours = module is None or module in " ".join(p.cmdline())
            rank = rank_of_name(p) or (p.environ().get("RANK") if ours else None)
        except psutil.Error:
            continue
        if rank is not None and rank.isdigit():
            found.setdefault(int(rank), p.pid)
    return found


def with_cmdline(needles, zombies: bool = False) -> list:
    """psutil processes, this one aside, whose command line holds one of `needles` (zombies only if
    asked: a launch's kill sweep reaps them, an orphan search must not report them)."""
    import psutil

    found, me = [], os.getpid()
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
        except psutil.Error:
            continue
        if p.pid != me and any(n in cmd for n in needles) \
                and (zombies or p.info["status"] != psutil.STATUS_ZOMBIE):
            found.append(p)
    return found


def live_processes(needles) -> list[tuple[int, str]]:
    """(pid, command line) of every live process, zombies and this one aside, whose command line holds one
    of `needles`."""
    return [(p.pid, " ".join(p.info["cmdline"] or [])) for p in with_cmdline(needles)]


def marked(token: str) -> list:
    """This user's live processes, other than this one, whose environment carries `token` (`OWNER_ENV`)."""
    import psutil

    found, uid, me = [], os.getuid(), os.getpid()
    for p in psutil.process_iter(["uids"]):
        try:
            if p.pid != me and p.info["uids"] is not None and p.info["uids"].real == uid \
                    and p.environ().get(OWNER_ENV) == token and alive(p):
                found.append(p)
        except psutil.Error:
            pass
    return found


def owned(token: str) -> list:
    """Every live process beneath this one, and every process `marked` with `token`."""
    import psutil

    found = {p.pid: p for p in psutil.Process().children(recursive=True) if alive(p)}
    for p in marked(token):
        found.setdefault(p.pid, p)
    return list(found.values())


# ---- the witness signal --------------------------------------------------------------------------------
def ask_witnesses(pids: dict[int, tuple], testimony, wait_s: float = WITNESS_WAIT_S) -> list[int]:
    """Send each rank process (rank -> (pid, start ticks), `rank_processes`) the witness signal, and wait until
    each living one wrote its testimony (`testimony(rank)`: the path it writes, `rundir.witness_file`) or
    `wait_s` passed; the ranks asked. Only that very rank process is signalled (`is_live_rank`: the signal
    would end another). Used by a failing rank for its peers (`rank/witness.py`) and by the launcher
    (`launch/watch.py`, `launch/cells.py`)."""
    asked = {}
    for r, (pid, ticks) in pids.items():
        try:
            if is_live_rank(pid, ticks):
                os.kill(pid, WITNESS_SIGNAL)
                asked[r] = (pid, ticks)
        except OSError:
            pass
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if all(Path(testimony(r)).exists() or not is_live_rank(*who) for r, who in asked.items()):
            break
        time.sleep(0.01)
    return sorted(asked)


# ---- die with the parent, and ending the rest ----------------------------------------------------------
def _prctl(option: int, value) -> None:
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(option, value)


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask Linux to send `sig` (SIGKILL) to this process when its parent dies (PR_SET_PDEATHSIG).
    Called by every rank, and in the launcher's child between fork and exec of the keeper (of srun with
    SIGTERM, which srun forwards to the agents on every node: a SIGKILLed srun could stop none)."""
    _prctl(PR_SET_PDEATHSIG, sig)


def become_subreaper() -> None:
    """Make this process the one that every orphaned descendant is re-parented to, instead of init
    (PR_SET_CHILD_SUBREAPER): what a run started stays beneath the keeper."""
    _prctl(PR_SET_CHILD_SUBREAPER, 1)


def parent_is_torchrun() -> bool:
    """Is this process still the child of a torchrun agent (torchrun, `python -m torch.distributed.run`, or
    ddplab's entry to it, `launch.loopback`)? False once it was re-parented to init or to a subreaper (the
    agent died before `die_with_parent` was armed): the keeper (`launch/keeper.py`) is one, and its own
    command line carries the agent's after `--`, which is not read. True where the parent cannot be read."""
    import psutil

    ppid = os.getppid()
    if ppid == 1:
        return False
    try:
        args = psutil.Process(ppid).cmdline()
    except psutil.Error:
        return True
    own = args[: args.index("--")] if "--" in args else args   # the program the parent itself runs
    return any(a in AGENTS or Path(a).name == "torchrun" for a in own)


def kill_until_gone(find, reaped=None, deadline_s: float = KILL_DEADLINE_S) -> list[dict]:
    """SIGKILL the live processes `find()` returns, and again what it finds next (a process that forked
    meanwhile, a child re-parented to a subreaper) until it finds none or `deadline_s` passed (a process
    in uninterruptible sleep dies only when its I/O ends); `reaped()` after each round. What it found
    first, described (pid, command line, lineage) before it was killed."""
    import psutil

    first, end = None, time.monotonic() + deadline_s
    while True:
        procs = [p for p in find() if alive(p)]
        first = _describe(procs) if first is None else first
        if not procs or time.monotonic() >= end:
            return first
        for p in procs:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(procs, timeout=max(0.1, min(2.0, end - time.monotonic())))
        if reaped is not None:
            reaped()


def _describe(procs) -> list[dict]:
    import psutil

    said = []
    for p in procs:
        try:
            named = f"[{p.name()}] " if rank_of_name(p) is not None else ""   # a forked rank: the agent's command line
            said.append({"pid": p.pid, "cmdline": named + (" ".join(p.cmdline()) or p.name()), "lineage": _lineage(p)})
        except psutil.Error:
            pass
    return said


def _lineage(p) -> str:
    """The command lines of `p` and its ancestors below this process, as far as they can be read."""
    import psutil

    said = []
    with contextlib.suppress(psutil.Error):
        for q in [p, *p.parents()]:
            if q.pid == os.getpid():
                break
            with contextlib.suppress(psutil.Error):
                said.append(" ".join(q.cmdline()))
    return " ".join(said)


def reap(keep: int | None = None) -> None:
    """Collect the exit status of every dead child but `keep` (one whose status `Popen` reads): a process
    that ended after its parent did was re-parented here (`become_subreaper`), and stays a zombie until then."""
    while True:
        try:
            seen = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if seen is None or seen.si_pid in (0, keep):
            return
        os.waitpid(seen.si_pid, 0)
