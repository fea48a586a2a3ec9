"""What went wrong in a run, said so a person can act on it: which rank, where, and why.

A failed run leaves per-rank files behind (see `rundir.py`): progress logs of the phases each rank
entered, and an error file with a traceback from each rank that raised. `diagnose` is pure: it
reads those records, orders them by the phases the task declared (`spec/tasks.py`), and decides
between
- a crash: a rank raised; the earliest error that is not a lost peer or a timeout is the cause;
- a hang: ranks timed out in a collective, or stopped making progress; the ranks that never
  reached the collective the others wait in are named (notes/ddp-internals.md, section 5);
- a missing result: a rank exited without writing its file (a signal, an os._exit, a kill);
- a lost run directory: the files of the run could not be written or read (`run_dir_lost`).
Used by `launch.run` and `results.load_run`; notebook 00 ends with a crash and a hang.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass, field

_LOST_PEER = ("connection closed", "connection reset", "broken pipe", "socket closed")


@dataclass
class Diagnosis:
    kind: str                         # "crash", "hang", "missing-result", "invalid-result", "diverged" or "run-dir"
    ranks: list[int]                  # the rank(s) to blame
    summary: str                      # what happened, in one paragraph
    tracebacks: dict[int, str] = field(default_factory=dict)
    log_tail: str = ""                # the end of launch.log, when no rank could say more

    def __str__(self) -> str:
        text = self.summary
        for rank, tb in sorted(self.tracebacks.items()):
            text += f"\n\n--- traceback of rank {rank} ---\n{tb.rstrip()}"
        if self.log_tail:
            text += f"\n\n--- end of launch.log ---\n{self.log_tail.rstrip()}"
        return text


class RunFailed(RuntimeError):
    """A run that did not produce a valid result on every rank. `.diagnosis` says why."""

    def __init__(self, diagnosis: Diagnosis, run_dir=None):
        self.diagnosis = diagnosis
        self.run_dir = run_dir
        where = f"\n(run directory: {run_dir})" if run_dir else ""
        super().__init__(f"{diagnosis}{where}")


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a run, after the whole process tree was stopped; a notebook shows it as one line."""

    def _render_traceback_(self) -> list[str]:   # IPython's hook for an exception's own rendering
        return [f"KeyboardInterrupt: {self}"]


def run_dir_lost(run_dir, error: OSError) -> Diagnosis:
    """The run's own directory failed it: deleted, moved, made read-only, or the disk is full."""
    what = f"{type(error).__name__}: {error.strerror or error}" + (f" ({error.filename})" if error.filename else "")
    return Diagnosis("run-dir", [], f"The run directory {run_dir} could not be written or read: {what}. "
                     "A run directory must stay in place and writable until the run ends: was it deleted, "
                     "moved or made read-only, or is the disk full? Every rank was stopped; run it again.")


def session_dir_lost(session_dir) -> Diagnosis:
    """The warm session's own directory went away under a job (the run directory is fine)."""
    return Diagnosis("session-dir", [], f"The session directory {session_dir} was deleted during the job: the warm "
                     "ranks read their jobs from it, so they were stopped. Nothing is wrong with the run itself; "
                     "run it again (a new session starts).")


def is_timeout(error: dict) -> bool:
    text = f"{error.get('type', '')} {error.get('message', '')}".lower()
    return "timed out" in text or "timeout" in text


def is_lost_peer(error: dict) -> bool:
    text = error.get("message", "").lower()
    return any(s in text for s in _LOST_PEER)


def phase_key(rec: dict, phases: dict) -> tuple:
    """How far a rank is: (step, micro-step or position, the phase's order); larger is further along.
    Setup (step -1) comes before every step and teardown after."""
    phase = phases.get(rec["phase"])
    order = phase.order if phase else 0
    step = 10 ** 9 if phase is not None and phase.after_steps else rec.get("step", -1)
    return step, rec.get("micro", 0), order


def _where(rec: dict) -> str:
    where = f"'{rec['phase']}'" + (f" ({rec['detail']})" if rec.get("detail") else "")
    if rec.get("step", -1) >= 0:
        where += f" of step {rec['step']}" + (f", micro-step {rec['micro']}" if rec.get("micro") else "")
    return where


def rank_list(ranks) -> str:
    ranks = sorted(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def diagnose_hang(progress: dict[int, list[dict]], world_size: int, timeout_s: float, watchdog: bool,
                  phases: dict, frozen: dict[int, str] | None = None) -> Diagnosis:
    """Name the ranks that never reached the collective the others are waiting in; a rank whose
    process the launcher saw frozen (`frozen`: rank -> process state) is the one to blame, wherever it stopped."""
    last = {r: progress[r][-1] for r in range(world_size) if progress.get(r)}
    silent = [r for r in range(world_size) if r not in last]
    how = (f"nothing moved for {timeout_s:g} s and ddplab stopped the run" if watchdog
           else f"the collective timed out after timeout_s={timeout_s:g} s")
    if not last:
        return Diagnosis("hang", list(range(world_size)), f"No rank recorded any progress; {how}.")
    if frozen:
        lines = [f"Rank {r} was stopped (its process was in state '{state}': SIGSTOP, Ctrl-Z or a debugger)"
                 + (f" in {_where(last[r])}." if r in last else ".") for r, state in sorted(frozen.items())]
        others = sorted(set(last) - set(frozen))
        if others:
            rec = last[others[0]]
            lines.append(f"{rank_list(others).capitalize()} waited for {'it' if len(frozen) == 1 else 'them'}"
                         + (f" in {_the(rec['collective'])} ({_where(rec)})" if rec.get("collective") else "")
                         + f", and {how}.")
        else:
            lines.append(f"{how[0].upper()}{how[1:]}.")
        return Diagnosis("hang", sorted(frozen), " ".join(lines))
    lead = max(phase_key(rec, phases) for rec in last.values())
    healthy = {name for name, p in phases.items() if not p.deviation}
    waiting = [r for r, rec in last.items() if phase_key(rec, phases) == lead and rec["phase"] in healthy]
    behind = sorted(set(range(world_size)) - set(waiting))
    if not waiting or not behind:
        rec = last[min(last)]
        return Diagnosis("hang", sorted(last), f"All ranks stopped together in {_where(rec)}"
                         f"{' (' + rec['collective'] + ')' if rec.get('collective') else ''}; {how}.")
    rec = last[waiting[0]]
    collective = _the(rec.get("collective") or "next collective")
    lines = [f"{rank_list(waiting).capitalize()} waited in {collective} ({_where(rec)}), and {how}."]
    for r in behind:
        if r in silent:
            lines.append(f"Rank {r} never arrived: it recorded no progress at all (it never started).")
            continue
        other = last[r]
        doing = f"it was in {_the(other['collective'])}" if other.get("collective") else "it was outside any collective"
        lines.append(f"Rank {r} never arrived: its last phase was {_where(other)}; {doing}.")
    return Diagnosis("hang", behind, " ".join(lines))


def _the(collective: str) -> str:
    """'all_reduce' -> 'the all_reduce'; a name that brings its own article keeps it."""
    return collective if collective.split(" ", 1)[0].lower() in ("the", "a", "an") else f"the {collective}"


def _last_phases(progress: dict[int, list[dict]], ranks) -> str:
    """'rank 1 was last in 'forward' of step 0; ...' for those of `ranks` that recorded anything."""
    return "; ".join(f"rank {r} was last in {_where(progress[r][-1])}" for r in ranks if progress.get(r))


@dataclass
class Deaths:
    """What is known of ranks that died without a word: the signal that ended each (from torchrun's
    report of its workers' exit codes), Python's faulthandler dump of a rank a fatal signal killed
    (rank{r}.fatal.txt), and the native (C++) error messages printed just before (gloo's checks
    abort the process: no Python exception, no error file)."""

    signals: dict[int, str] = field(default_factory=dict)    # rank -> "SIGABRT"
    stacks: dict[int, str] = field(default_factory=dict)     # rank -> faulthandler's dump
    native: list[str] = field(default_factory=list)          # "what():" lines of C++ exceptions
    # NCCL: ranks whose watchdog timed a collective out (and aborted the process): rank -> (seq, op)
    nccl_timeouts: dict[int, tuple[int, str]] = field(default_factory=dict)
    # NCCL's flight recorder, dumped on timeout: rank -> its last collective {seq, name, state}
    flight: dict[int, dict] = field(default_factory=dict)
    # simulated nodes (launch/nodes.py): agent -> (the signal that ended its torchrun agent, its ranks)
    lost_nodes: dict[int, tuple[str, list[int]]] = field(default_factory=dict)


_EXIT = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank[^\n]*\n\s*exitcode\s*:\s*(-?\d+)")
_NATIVE = re.compile(r"what\(\):\s*(.+)")
_NODE_LOST = re.compile(r"ddplab-nodes: node agent (\d+) was ended by (\S+); its ranks: ([\d, ]+|unknown)")
# ProcessGroupNCCL's watchdog: "[PG ID 0 PG GUID 0(default_pg) Rank 1] Watchdog caught collective operation
# timeout: WorkNCCL(SeqNum=6, OpType=ALLREDUCE, NumelIn=1, ...) ran for 5002 milliseconds before timing out."
_NCCL_TIMEOUT = re.compile(r"Rank (\d+)\][^\n]*?Watchdog caught collective operation timeout: "
                           r"WorkNCCL\(SeqNum=(\d+), OpType=(\w+)")
FLIGHT_PREFIX = "nccl_trace_rank_"   # TORCH_FR_DUMP_TEMP_FILE's prefix in a launch directory (launch.torchrun)


def exit_codes(log_text: str) -> dict[int, int]:
    """rank -> its exit code, from torchrun's failure report in a log (pure; negative: a signal)."""
    return {int(rank): int(code) for rank, code in _EXIT.findall(log_text)}


def exit_said(code: int) -> str:
    """'was killed by SIGKILL' or 'exited with code 3' (pure)."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def deaths_from(log_text: str, stacks: dict[int, str] | None = None) -> Deaths:
    """`Deaths` from the text of launch.log (torchrun's failure report and what the ranks printed)
    and the faulthandler dumps the ranks left (pure). A negative exit code is a signal."""
    signals = {}
    for rank, code in _EXIT.findall(log_text):
        if int(code) < 0:
            try:
                signals[int(rank)] = signal.Signals(-int(code)).name
            except ValueError:
                signals[int(rank)] = f"signal {-int(code)}"
    native = list(dict.fromkeys(m.strip() for m in _NATIVE.findall(log_text)))
    timeouts = {}
    for rank, seq, op in _NCCL_TIMEOUT.findall(log_text):
        timeouts.setdefault(int(rank), (int(seq), op))
    lost = {int(agent): (how, [int(r) for r in ranks.split(",") if r.strip().isdigit()])
            for agent, how, ranks in _NODE_LOST.findall(log_text)}
    return Deaths(signals, dict(stacks or {}), native, timeouts, lost_nodes=lost)


def flight_records(launch_dir, world_size: int) -> dict[int, dict]:
    """Each rank's last collective in NCCL's flight recorder dump (`<launch_dir>/nccl_trace_rank_<r>`,
    written by the watchdog on a timeout): {"seq", "name", "state"}, in the process group all the
    dumps share (the training group; a sequence number counts within one group). The dump is a
    pickle of plain data; it is read with no class allowed, so a file that holds anything else is skipped."""
    import pickle
    from pathlib import Path

    class _Plain(pickle.Unpickler):
        def find_class(self, module, name):
            raise pickle.UnpicklingError(f"{module}.{name} is not plain data")

    by_group: dict[int, dict] = {}   # rank -> process group -> its last collective there
    for r in range(world_size):
        path = Path(launch_dir) / f"{FLIGHT_PREFIX}{r}"
        try:
            with open(path, "rb") as f:
                entries = _Plain(f).load().get("entries", [])
        except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ValueError):
            continue
        for e in entries:
            if isinstance(e, dict) and e.get("collective_seq_id"):
                pg = str(e.get("process_group", ""))
                last = by_group.setdefault(r, {}).get(pg)
                if last is None or e["collective_seq_id"] > last["collective_seq_id"]:
                    by_group[r][pg] = e
    if not by_group:
        return {}
    # sequence numbers count per process group: compare the ranks in a group every one of them used
    common = set.intersection(*(set(g) for g in by_group.values()))
    if not common:
        return {}
    pg = max(common, key=lambda g: sum(d[g]["collective_seq_id"] for d in by_group.values()))
    return {r: {"seq": d[pg]["collective_seq_id"], "name": str(d[pg].get("profiling_name", "?")),
                "state": str(d[pg].get("state", "?"))} for r, d in by_group.items()}


def _nccl_hang(d: "Diagnosis", deaths: Deaths, world_size: int, timeout_s: float) -> "Diagnosis":
    """A hang diagnosis completed with what NCCL said: whose watchdog timed out, in which collective,
    and, from the flight recorder, how far each rank got (the one furthest behind never arrived)."""
    t = deaths.nccl_timeouts
    seq = {r: s for r, (s, _) in t.items()}
    lines = [f"NCCL's watchdog timed out {rank_list(sorted(t))} after timeout_s={timeout_s:g} s in "
             + "; ".join(f"rank {r}'s collective #{s} ({op.lower()})" for r, (s, op) in sorted(t.items()))
             + ", and aborted the processes (TORCH_NCCL_ASYNC_ERROR_HANDLING=1)."]
    if deaths.flight:
        lines.append("NCCL's flight recorder: " + "; ".join(
            f"rank {r} last issued collective #{f['seq']} ({f['name']}, {f['state']})"
            for r, f in sorted(deaths.flight.items())) + ".")
        seq = {r: f["seq"] for r, f in deaths.flight.items()}
    if len(set(seq.values())) > 1:   # ranks that issued fewer collectives are the ones the others wait for
        behind = sorted(r for r, s in seq.items() if s == min(seq.values()))
        if not set(d.ranks) & set(behind) or d.ranks == list(range(world_size)):
            d.ranks = behind
    d.summary = f"{d.summary} {' '.join(lines)}"
    return d


def _culprits(ranks: list[int], deaths: Deaths | None) -> list[int]:
    """Of the ranks that left no file, those a signal other than SIGTERM ended, if any: when one worker
    dies, torchrun's agent stops the others with SIGTERM, and those are not the cause."""
    hard = [r for r in ranks if deaths is not None and deaths.signals.get(r) not in (None, "SIGTERM")]
    return hard or ranks


def _stacks(deaths: Deaths | None, ranks) -> dict[int, str]:
    """The faulthandler dumps of those of `ranks` that left one (a Diagnosis' tracebacks)."""
    return {r: t for r, t in (deaths.stacks if deaths else {}).items() if r in ranks}


def _died(ranks, progress: dict, deaths: Deaths | None) -> str:
    """What is known of how each of `ranks` died: its signal, its last phase, the native error."""
    if deaths is None:
        return ""
    out = []
    for r in ranks:
        sig = deaths.signals.get(r)
        if sig is None and r in deaths.stacks:
            sig = deaths.stacks[r].splitlines()[0].replace("Fatal Python error: ", "a fatal signal: ")
        if sig is None:
            continue
        where = f" in {_where(progress[r][-1])}" if progress.get(r) else ""
        why = (" (SIGKILL cannot be caught: the kernel's out-of-memory killer, a scheduler or `kill -9` sent it)"
               if sig == "SIGKILL" else "")
        out.append(f"Rank {r} was killed by {sig}{where}{why}.")
    if deaths.native and out:
        out.append("The native error it printed: " + " / ".join(deaths.native[:2]))
    return " ".join(out)


def diagnose(progress: dict[int, list[dict]], errors: dict[int, dict], finished: set[int], world_size: int,
             timeout_s: float, watchdog: bool, phases: dict, frozen: dict[int, str] | None = None,
             deaths: Deaths | None = None) -> Diagnosis:
    """Explain a failed run from its per-rank records (pure; the launcher gathers the records,
    `frozen`, the ranks whose process it saw stopped, and in which state, and `deaths`, what is known
    of ranks that died without writing anything)."""
    if deaths is not None and deaths.lost_nodes:   # a whole node went: its ranks did not fail, they were lost
        agent, (how, ranks) = min(deaths.lost_nodes.items())
        others = sorted(set(range(world_size)) - set(ranks))
        return Diagnosis("node-lost", ranks or others,
                         f"Node {agent} was lost: its torchrun agent was ended by {how}, and its "
                         f"{rank_list(ranks) if ranks else 'ranks'} with it; the others "
                         f"{f'({rank_list(others)}) ' if ranks else ''}then lost their peers and were stopped. On a cluster that is a node failing, or a limit "
                         f"of the job (time, memory) ending it there. See launch.log.")
    causes = sorted((e for e in errors.values() if not is_timeout(e) and not is_lost_peer(e)), key=lambda e: e["t_ns"])
    if causes:
        first = causes[0]
        others = sorted(set(errors) - {first["rank"]})
        text = f"Rank {first['rank']} failed in {_where(first)}: {first['type']}: {first['message']}."
        if others:
            text += f" Then {rank_list(others)} failed too, having lost a peer or been stopped."
        return Diagnosis("crash", [first["rank"]], text, {first["rank"]: first["traceback"]})
    if watchdog or frozen or any(is_timeout(e) for e in errors.values()):
        d = diagnose_hang(progress, world_size, timeout_s, watchdog, phases, frozen)
        timed_out = [r for r, e in errors.items() if is_timeout(e)]
        if timed_out:
            first = errors[min(timed_out)]
            d.tracebacks = {first["rank"]: first["traceback"]}
        return _nccl_hang(d, deaths, world_size, timeout_s) if deaths is not None and deaths.nccl_timeouts else d
    if deaths is not None and deaths.nccl_timeouts:   # NCCL's hang: its watchdog aborted the waiting ranks
        return _nccl_hang(diagnose_hang(progress, world_size, timeout_s, False, phases, frozen), deaths, world_size,
                          timeout_s)
    silent = sorted(set(range(world_size)) - finished - set(errors))
    silent = _culprits(silent, deaths)
    stacks = _stacks(deaths, silent)
    if silent and errors:  # peers only lost their connection: the rank that left no word at all went first
        died = _died(silent, progress, deaths)
        waited = sorted({rec["collective"] for r in errors if progress.get(r) and (rec := progress[r][-1]).get("collective")})
        if died and waited:
            died += f" Its peers were waiting in {_the(waited[0])}."
        last = _last_phases(progress, silent)
        return Diagnosis("missing-result", silent,
                         f"{rank_list(silent).capitalize()} exited without writing a result or an error"
                         + (f"; {rank_list(sorted(errors))} then lost the connection to it. {died}" if died else
                            f" (killed by a signal, or out of memory?); {rank_list(sorted(errors))} then lost the "
                            f"connection to it." + (f" {last.capitalize()}." if last else "")), stacks)
    if errors:
        first = min(errors.values(), key=lambda e: e["t_ns"])
        return Diagnosis("crash", [first["rank"]], f"Rank {first['rank']} lost its peers in {_where(first)}: "
                         f"{first['type']}: {first['message']}", {first["rank"]: first["traceback"]})
    missing = _culprits(sorted(set(range(world_size)) - finished), deaths)
    died = _died(missing, progress, deaths)
    detail = _last_phases(progress, missing)
    return Diagnosis("missing-result", missing,
                     f"{rank_list(missing).capitalize()} exited without writing a result or an error"
                     + (f". {died}" if died else f" (killed by a signal?).{' ' + detail + '.' if detail else ''}")
                     + " See launch.log.", _stacks(deaths, missing))


@dataclass
class Provoked:
    """One failure provoked on purpose (`launch.failure_lab.provoke`): the fault injected, what the
    launcher said (None: the run did not fail), seconds from the launch to the error, the
    collective timeout it ran with, any process of the run still alive afterwards (orphans), and how
    much of `seconds` was start-up (processes, imports, the process group), which a loaded machine
    stretches without bound and the launcher's timeout does not cover."""

    name: str
    fault_kind: str | None
    fault_rank: int | None
    diagnosis: Diagnosis | None
    seconds: float
    timeout_s: float
    orphans: list[str] = field(default_factory=list)
    startup_s: float = 0.0     # of `seconds`, until the last rank began its task (its progress log says when)
