"""What went wrong in a run, said so a person can act on it: which rank, where, and why.

A failed run leaves per-rank files behind (see `rundir.py`): progress logs of the phases each rank
entered, and an error file with a traceback from each rank that raised. `diagnose` is pure: it
reads those records, orders them by the phases the task declared (`spec/tasks.py`), and decides
between
- a crash: a rank raised; the earliest error that is not a lost peer or a timeout is the cause;
- a hang: ranks timed out in a collective, or stopped making progress; the ranks that never
  reached the collective the others wait in are named (docs/ddp-internals.md, "Hangs and debug modes");
- a missing result: a rank exited without writing its file (a signal, an os._exit, a kill);
- a lost run directory: the files of the run could not be written or read (`run_dir_lost`).
Used by `launch.run` and `results.load_run`; notebook 00 ends with a crash and a hang.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .deaths import Deaths, rank_list

_LOST_PEER = ("connection closed", "connection reset", "broken pipe", "socket closed")


@dataclass
class Diagnosis:
    kind: str                         # "crash", "hang", "missing-result", "invalid-result", "diverged" or "run-dir"
    ranks: list[int]                  # the rank(s) to blame
    summary: str                      # what happened, in one paragraph
    tracebacks: dict[int, str] = field(default_factory=dict)
    log_tail: str = ""                # the end of launch.log, when no rank could say more
    flight: object = None             # torch's flight recorder analyzer on the ranks' records (witnesses.FlightVerdict)
    stacks: dict[int, str] = field(default_factory=dict)   # rank -> where it was when asked (witnesses.stack)

    def __str__(self) -> str:
        text = self.summary
        if self.flight is not None:
            text += f"\n{self.flight}."
        for rank, st in sorted(self.stacks.items()):
            text += f"\n\n--- rank {rank} when the launcher asked (its code first, library frames folded) ---\n{st}"
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


def diagnose_hang(progress: dict[int, list[dict]], world_size: int, timeout_s: float, watchdog: bool,
                  phases: dict, frozen: dict[int, str] | None = None) -> Diagnosis:
    """Name the ranks that never reached the collective the others are waiting in; a rank whose
    process the launcher saw frozen (`frozen`: rank -> process state) is the one to blame, wherever it stopped."""
    last = {r: progress[r][-1] for r in range(world_size) if progress.get(r)}
    silent = [r for r in range(world_size) if r not in last]
    how = (f"nothing moved for {timeout_s:g} s and ddplab stopped the run" if watchdog
           else f"the collective timed out after timeout_s={timeout_s:g} s")
    if frozen:
        lines = [f"Rank {r} was stopped (its process was in state '{state}': SIGSTOP, Ctrl-Z or a debugger)"
                 + (f" in {_where(last[r])}." if r in last else
                    " while still starting (before its first progress record: importing torch or joining)")
                 for r, state in sorted(frozen.items())]
        others = sorted(set(last) - set(frozen))
        if others:
            rec = last[others[0]]
            lines.append(f"{rank_list(others).capitalize()} waited for {'it' if len(frozen) == 1 else 'them'}"
                         + (f" in {_the(rec['collective'])} ({_where(rec)})" if rec.get("collective") else "")
                         + f", and {how}.")
        else:
            lines.append(f"{how[0].upper()}{how[1:]}.")
        return Diagnosis("hang", sorted(frozen), " ".join(lines))
    if not last:
        return Diagnosis("hang", list(range(world_size)), f"No rank recorded any progress; {how}.")
    compiling = sorted(r for r, rec in last.items() if rec.get("compiling"))
    if compiling and watchdog and len(compiling) == len(last):
        return Diagnosis("compile-timeout", compiling, f"{rank_list(compiling).capitalize()} {'was' if len(compiling) == 1 else 'were'} still compiling "
                         f"(torch.compile) in {_where(last[compiling[0]])}, and {how}: compilation is progress, and "
                         f"this is compile's own bound, not a hang in a collective. A compile this long is the "
                         f"model's size on this machine's cores: raise the bound ($DDPLAB_COMPILE_LIMIT_S), or "
                         f"compile a smaller model or with a lighter backend (aot_eager).")
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
        if other.get("compiling"):
            doing = "it was still compiling (torch.compile), outside any collective"
        lines.append(f"Rank {r} never arrived: its last phase was {_where(other)}; {doing}.")
    return Diagnosis("hang", behind, " ".join(lines))


def _the(collective: str) -> str:
    """'all_reduce' -> 'the all_reduce'; a name that brings its own article keeps it."""
    return collective if collective.split(" ", 1)[0].lower() in ("the", "a", "an") else f"the {collective}"


def _last_phases(progress: dict[int, list[dict]], ranks) -> str:
    """'rank 1 was last in 'forward' of step 0; ...' for those of `ranks` that recorded anything."""
    return "; ".join(f"rank {r} was last in {_where(progress[r][-1])}" for r in ranks if progress.get(r))


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
    hard = [r for r in ranks if deaths is not None and (deaths.signals.get(r) not in (None, "SIGTERM")
                                                         or r in deaths.exits)]
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
        if r in deaths.exits:   # torchrun's report: it ended itself (os._exit, sys.exit, a native library's exit)
            where = f" in {_where(progress[r][-1])}" if progress.get(r) else " before its first progress record"
            out.append(f"Rank {r} exited with code {deaths.exits[r]}{where} (torchrun's report): its own code or a "
                       f"library it called ended the process (os._exit, sys.exit, exit()), not a signal.")
            continue
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
    if (deaths is not None and deaths.agent and set(range(world_size)) - finished - set(errors)
            and all(is_lost_peer(e) for e in errors.values())):   # a rank's own error or timeout came first
        return _agent_died(progress, errors, finished, world_size, deaths.agent)
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


def _agent_died(progress: dict, errors: dict, finished: set[int], world_size: int, agent: str) -> Diagnosis:
    """torchrun itself was ended from outside: its ranks went with it (they die with their parent), and
    none of them is to blame."""
    silent = sorted(set(range(world_size)) - finished - set(errors))
    started = [r for r in silent if progress.get(r)]
    when = (f"mid-run ({_last_phases(progress, started)})" if started else
            "at start-up, before any rank recorded progress")
    return Diagnosis("agent-died", silent, f"{agent[0].upper()}{agent[1:]} {when}, and {rank_list(silent)} went "
                     "with it (each rank dies with its torchrun). No rank failed: something outside the launch ended "
                     "torchrun (a kill, the out-of-memory killer, a scheduler's limit). See launch.log.")


@dataclass
class Provoked:
    """One failure provoked on purpose (`launch.provoked.provoke`): the fault injected, what the
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
