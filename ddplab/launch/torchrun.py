"""The torchrun process tree: the command that starts the ranks, their environment, and killing it all.

For a 4-rank experiment the command is

    python -m ddplab.launch.loopback --rdzv-backend=ddplab-loopback --rdzv-endpoint=127.0.0.1:0 \\
        --rdzv-id=ddplab --local-addr=127.0.0.1 --nnodes=1 --nproc-per-node=4 --max-restarts=0 \\
        -m ddplab.rank.worker --spec runs/<name>-<hash>/spec.json

that is torchrun (`torch.distributed.run`, every flag of it) with its rendezvous stores bound to
127.0.0.1 instead of every interface (`launch.loopback`); the kernel picks free ports, nothing here
hard-codes one. The ranks' gloo and NCCL sockets stay on the loopback interface too (`worker_env`).
On several nodes (`launch.nodes`: simulated on this host, or `srun` on a SLURM allocation) the same
flags carry `--nnodes=N` and a c10d rendezvous every agent meets at.
torchrun runs under a keeper (`launch/keeper.py`) that dies with the launcher (PR_SET_PDEATHSIG,
`processes.die_with_parent`) and takes every process the run started with it, each rank dies with torchrun,
and `kill_tree` reaps every process of a launch: no orphans. Used by the cold launch and
`ddplab doctor`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path

from .. import host, processes, rundir
from ..deaths import FLIGHT_PREFIX
from ..processes import OWNER_ENV, WORKER
from .keeper import STOP_SIGNAL
from .nodes import DEFAULT_JOIN_TIMEOUT_S, Nodes, first_node

RENDEZVOUS_BACKEND = "ddplab-loopback"  # registered by launch.loopback, torchrun's entry here


def torchrun_argv(world_size: int, args: list, python: str | None = None, module: str = WORKER,
                  script: str | None = None, nodes: Nodes | None = None,
                  rdzv_timeout_s: int = DEFAULT_JOIN_TIMEOUT_S) -> list[str]:
    """The exact command that starts `world_size` ranks of `python -m module *args` (or of `script`) on
    `nodes` (default `Nodes.from_env()`: one node unless $DDPLAB_NODES says otherwise). On several
    nodes the agents wait `rdzv_timeout_s` for each other, and as long to reach the rendezvous (pure)."""
    nodes = Nodes.from_env() if nodes is None else nodes
    target = [str(script)] if script else ["-m", module]
    python = python or sys.executable
    per_node = nodes.per_node(world_size)
    if nodes.launcher == "srun":
        return srun_argv(nodes.count, per_node, [*target, *map(str, args)], python,
                         nodes.endpoint or f"{first_node()}:{29500 + uuid.uuid4().int % 20000}",
                         f"ddplab-{uuid.uuid4().hex[:8]}", rdzv_timeout_s)
    flags = [f"--rdzv-backend={RENDEZVOUS_BACKEND}", f"--rdzv-endpoint={host.LOOPBACK}:0", "--rdzv-id=ddplab",
             f"--local-addr={host.LOOPBACK}", f"--nnodes={nodes.count}", f"--nproc-per-node={per_node}",
             "--max-restarts=0"]
    if nodes.count > 1:   # several agents on this host, meeting at one loopback rendezvous (launch.nodes)
        return [python, "-m", "ddplab.launch.nodes", f"--agents={nodes.count}", "--",
                *flags, f"--rdzv-conf={rdzv_conf(rdzv_timeout_s)}", *target, *map(str, args)]
    return [python, "-m", "ddplab.launch.loopback", *flags, *target, *map(str, args)]


def rdzv_conf(timeout_s: int) -> str:
    """torchrun's --rdzv-conf: how long agents wait for each other (join) and for the store (read)."""
    return f"join_timeout={timeout_s},read_timeout={min(timeout_s, 60)}"


def srun_argv(count: int, per_node: int, target: list[str], python: str, endpoint: str, rdzv_id: str,
              rdzv_timeout_s: int = DEFAULT_JOIN_TIMEOUT_S) -> list[str]:
    """One torchrun agent on each of `count` nodes of a SLURM allocation, meeting at a c10d rendezvous
    at `endpoint` (host:port, on a node of the allocation) (pure; the batch script of `launch.slurm`
    runs the same command)."""
    return ["srun", f"--nodes={count}", f"--ntasks={count}", "--ntasks-per-node=1", "--kill-on-bad-exit=1",
            python, "-m", "torch.distributed.run", f"--nnodes={count}", f"--nproc-per-node={per_node}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={rdzv_id}",
            f"--rdzv-conf={rdzv_conf(rdzv_timeout_s)}", "--max-restarts=0", *target]


def worker_argv(world_size: int, spec_paths: list, python: str | None = None, nodes: Nodes | None = None) -> list[str]:
    """torchrun of the ddplab worker over these specs."""
    return torchrun_argv(world_size, ["--spec", *spec_paths], python, nodes=nodes)


def worker_env(base: dict | None = None, nodes: Nodes | None = None, flight_dir: Path | None = None) -> dict:
    """The ranks' environment: the caller's, plus the current directory on PYTHONPATH (for a
    user's `module:factory` model or task), one OpenMP thread per rank and gloo's and NCCL's
    sockets on the loopback interface when every node is on this host, unless the caller chose (on
    several machines, gloo and NCCL pick the interface that reaches the other nodes). NCCL's flight
    recorder keeps each rank's last collectives and its watchdog dumps them into `flight_dir` on a
    timeout (`deaths.flight_records` reads them), then aborts the communicators and the process."""
    env = dict(os.environ if base is None else base)
    paths = [os.getcwd(), str(Path(__file__).resolve().parent.parent.parent)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.setdefault("OMP_NUM_THREADS", "1")  # torchrun's own default for several ranks, without its banner
    # torchrun's agent hosts the ranks' store on loopback (launch.loopback) only while that store is shared
    env.pop("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", None)
    # the flight recorder: each rank's last collectives (torch 2.13 reads TORCH_FR_BUFFER_SIZE, and the older
    # TORCH_NCCL_TRACE_BUFFER_SIZE only with a deprecation warning); dumped on a timeout with DUMP_ON_TIMEOUT
    env.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
    env.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
    env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")     # a timed-out collective tears the process down
    if flight_dir is not None:
        env.setdefault("TORCH_FR_DUMP_TEMP_FILE", str(Path(flight_dir) / FLIGHT_PREFIX))
    nodes = Nodes.from_env(env) if nodes is None else nodes
    lo = host.loopback_interface() if nodes.launcher == "local" else None
    if lo:  # one machine: the ranks talk over loopback, and nothing listens on another interface
        env.setdefault("GLOO_SOCKET_IFNAME", lo)
        env.setdefault("NCCL_SOCKET_IFNAME", lo)
    return env


def start(argv: list[str], env: dict, stdout, text: bool = False, outlive_thread: bool = False,
          report: Path | None = None, orphaned_remove: tuple = ()) -> subprocess.Popen:
    """Start torchrun in its own session, under a keeper (`launch/keeper.py`) that dies with this process
    (Linux) and takes everything the run started with it; `report`: where the keeper names what a run
    that ended by itself left running (it stops those), `orphaned_remove`: folders it removes if this
    process dies first. srun's launch is started as it is (its processes on other nodes are srun's).

    Linux's parent-death signal fires when the *thread* that started the child ends, not the process.
    A launch waits for its torchrun on the thread that started it, but a session's ranks must outlive
    the call that started them, which may run on a short-lived thread (a widget's click handler):
    `outlive_thread` starts it from one long-lived thread of this module instead."""
    srun = _is_srun(argv)
    token, tmp = uuid.uuid4().hex, None
    if not srun:   # not -I: it finds a psutil in the user's site or on PYTHONPATH (-P: launch/ stays off sys.path)
        tmp = _run_tmp(env)
        safe_path = ["-P"] if sys.version_info >= (3, 11) else []
        argv = [sys.executable, *safe_path, str(Path(__file__).with_name("keeper.py")), "--owner", str(os.getpid()),
                "--tmp", tmp, *(["--report", str(report)] if report else []),
                *[a for d in orphaned_remove for a in ("--orphaned-remove", str(d))], "--", *argv]
        env = {**env, OWNER_ENV: token}

    def popen():
        return subprocess.Popen(argv, stdout=stdout, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True, text=text,
                                preexec_fn=(lambda: processes.die_with_parent(signal.SIGTERM))
                                if sys.platform.startswith("linux") else None)

    try:
        proc = popen() if not outlive_thread or threading.current_thread() is threading.main_thread() \
            else _spawner().call(popen)
    except BaseException:
        if tmp:
            os.rmdir(tmp)
        raise
    proc.ddplab_owner = None if srun else token   # kill_tree finds the run's processes by it
    proc.ddplab_tmp = tmp   # the keeper's temporary folder, which kill_tree removes if the keeper could not
    return proc


def _run_tmp(env: dict) -> str:
    """A new temporary folder for a run, in the $TMPDIR the run would see (else where Python puts them)."""
    import tempfile

    try:
        return tempfile.mkdtemp(prefix="ddplab-run-", dir=env.get("TMPDIR") or None)
    except OSError:   # $TMPDIR names no folder this user can write to
        return tempfile.mkdtemp(prefix="ddplab-run-")


class _Spawner:
    """One daemon thread that lives as long as the process and starts processes on request."""

    def __init__(self):
        import queue

        self.requests = queue.Queue()
        threading.Thread(target=self._serve, name="ddplab-spawner", daemon=True).start()

    def _serve(self):
        while True:
            fn, answer, ready = self.requests.get()
            try:
                answer.append((True, fn()))
            except BaseException as e:  # noqa: BLE001 - handed back to the caller
                answer.append((False, e))
            ready.set()

    def call(self, fn):
        answer: list = []
        ready = threading.Event()
        self.requests.put((fn, answer, ready))
        ready.wait()
        ok, value = answer[0]
        if not ok:
            raise value
        return value


_SPAWNER: list = []
_SPAWNER_LOCK = threading.Lock()


def _spawner() -> _Spawner:
    with _SPAWNER_LOCK:
        if not _SPAWNER:
            _SPAWNER.append(_Spawner())
        return _SPAWNER[0]


@contextlib.contextmanager
def interrupts_caught():
    """Turn Ctrl-C (SIGINT) into a flag while the block runs: it yields a list that each Ctrl-C
    appends to, and no KeyboardInterrupt can cut the block short (a launch checks the flag between
    polls, and a second Ctrl-C cannot interrupt the process-tree kill). Off the main thread, or where
    Ctrl-C is ignored, nothing changes: there is no Ctrl-C to catch."""
    caught: list[int] = []
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) in (signal.SIG_IGN, None):
        yield caught
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield caught
    finally:
        signal.signal(signal.SIGINT, previous)


def _procs_of(proc: subprocess.Popen, spec_path: Path) -> list:
    """torchrun (unless already reaped: its pid may be reused), its descendants, and any process,
    re-parented or not, whose command line carries this launch's absolute spec path."""
    import psutil

    found = {}
    if proc.returncode is None:
        try:
            root = psutil.Process(proc.pid)
            for p in [root, *root.children(recursive=True)]:
                found[p.pid] = p
        except psutil.Error:
            pass
    for p in processes.marked(proc.ddplab_owner) if getattr(proc, "ddplab_owner", None) else []:
        found.setdefault(p.pid, p)   # what the run started and that left the tree (the keeper was killed)
    for p in processes.with_cmdline((str(Path(spec_path).resolve()),), zombies=True):
        found.setdefault(p.pid, p)
    return list(found.values())


def _is_srun(argv) -> bool:
    """Is this launch srun's (`srun_argv`), whose agents on other nodes only srun can reach?"""
    return Path(str(argv[0])).name == "srun"


SRUN_GRACE_S = 15.0   # how long srun may take to stop the agents on the other nodes


def processes_for(run_dir: Path) -> list[str]:
    """Command lines of live processes started for this run directory (or a launch staged beside it)."""
    run_dir = Path(run_dir)
    return [cmd for _, cmd in processes.live_processes((str(run_dir), f"{run_dir.parent}/.{run_dir.name}."))]


def sweep_dead(parent: Path, pattern: str) -> list[Path]:
    """Delete the directories matching `pattern` in `parent` that are provably dead: the process that
    claimed them (`rundir.claim`) is gone, on this host, and no live process names them. A killed
    launcher's staging directory and a session's leave nothing else behind; anything unclaimed stays."""
    import shutil

    removed = []
    for d in sorted(Path(parent).glob(pattern)) if Path(parent).is_dir() else []:
        if d.is_dir() and not d.is_symlink() and rundir.owner_gone(d) and not processes_for(d):
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed


KEEPER_GRACE_S = 5.0   # how long the keeper may take to stop the run, remove its folder and write its report


def kill_tree(proc: subprocess.Popen, spec_path: Path) -> None:
    """Stop torchrun and every process of this run, and reap them: no orphans survive. The keeper is
    asked first (STOP_SIGNAL: it kills the run, names in its report what the ranks started, removes its
    temporary folder), then everything left is SIGKILLed, and the folder removed if the keeper could not.
    Under srun the agents on other nodes are not this host's processes: srun is asked first (SIGTERM,
    which it forwards to every task, and torchrun's agents stop their ranks on it)."""
    import shutil

    if proc.returncode is None and proc.poll() is None and (_is_srun(proc.args) or getattr(proc, "ddplab_owner", None)):
        proc.send_signal(signal.SIGTERM if _is_srun(proc.args) else STOP_SIGNAL)
        try:
            proc.wait(timeout=SRUN_GRACE_S if _is_srun(proc.args) else KEEPER_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
    processes.kill_until_gone(lambda: _procs_of(proc, spec_path))   # again while the tree forks under the kill
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    if getattr(proc, "ddplab_tmp", None):
        shutil.rmtree(proc.ddplab_tmp, ignore_errors=True)
