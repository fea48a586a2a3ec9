"""What is known of ranks that died without a word (pure, except reading the flight recorder's dumps):
torchrun's report of its workers' exit codes and signals, Python's faulthandler dumps, native (C++)
error lines, NCCL's watchdog timeouts and flight recorder, and simulated nodes that were lost.
`failures.diagnose` reads it beside the ranks' own records."""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass, field

from .rundir import LOG


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
    exits: dict[int, int] = field(default_factory=dict)      # rank -> its exit code (> 0: os._exit, sys.exit)
    agent: str = ""   # torchrun itself ended by a signal, not by its ranks: "torchrun, the launch's agent, was killed by SIGKILL"


_EXIT = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank[^\n]*\n\s*exitcode\s*:\s*(-?\d+)")
_NATIVE = re.compile(r"what\(\):\s*(.+)")
# where torch's build machine kept its sources ("/__w/pytorch/pytorch/third_party/gloo/gloo/...", "/opt/
# pytorch/torch/csrc/..."): cut to the path inside the project ("gloo/transport/tcp/pair.cc:456")
_BUILD_PREFIX = re.compile(r"(?<![\w./])/[^\s\[\]]*?/(?:third_party/[^/\s]+/|pytorch/(?=(?:torch|c10|aten|caffe2)/))")
_NODE_LOST = re.compile(r"ddplab-nodes: node agent (\d+) was ended by (\S+); its ranks: ([\d, ]+|unknown)")
# ProcessGroupNCCL's watchdog: "[PG ID 0 PG GUID 0(default_pg) Rank 1] Watchdog caught collective operation
# timeout: WorkNCCL(SeqNum=6, OpType=ALLREDUCE, NumelIn=1, ...) ran for 5002 milliseconds before timing out."
_NCCL_TIMEOUT = re.compile(r"Rank (\d+)\][^\n]*?Watchdog caught collective operation timeout: "
                           r"WorkNCCL\(SeqNum=(\d+), OpType=(\w+)")
# torchrun's agent caught SIGTERM, SIGINT, SIGHUP or SIGQUIT: it stops its ranks and raises this (and may log it)
_AGENT_SIGNAL = re.compile(r"SignalException: Process (\d+) got signal: (\d+)")
FLIGHT_PREFIX = "nccl_trace_rank_"   # TORCH_FR_DUMP_TEMP_FILE's prefix in a launch directory (launch.torchrun)


def exit_codes(log_text: str) -> dict[int, int]:
    """rank -> its exit code, from torchrun's failure report in a log (pure; negative: a signal)."""
    return {int(rank): int(code) for rank, code in _EXIT.findall(log_text)}


def exit_said(code: int) -> str:
    """'was killed by SIGKILL' or 'exited with code 3' (pure)."""
    if code < 0:
        return f"was killed by {signal_name(-code)}"
    return f"exited with code {code}"


def deaths_from(log_text: str, stacks: dict[int, str] | None = None) -> Deaths:
    """`Deaths` from the text of launch.log (torchrun's failure report and what the ranks printed)
    and the faulthandler dumps the ranks left (pure). A negative exit code is a signal."""
    signals = {int(rank): signal_name(-int(code)) for rank, code in _EXIT.findall(log_text) if int(code) < 0}
    native = list(dict.fromkeys(_BUILD_PREFIX.sub("", m.strip()) for m in _NATIVE.findall(log_text)))
    timeouts = {}
    for rank, seq, op in _NCCL_TIMEOUT.findall(log_text):
        timeouts.setdefault(int(rank), (int(seq), op))
    lost = {int(agent): (how, [int(r) for r in ranks.split(",") if r.strip().isdigit()])
            for agent, how, ranks in _NODE_LOST.findall(log_text)}
    exits = {r: c for r, c in exit_codes(log_text).items() if c > 0}
    return Deaths(signals, dict(stacks or {}), native, timeouts, lost_nodes=lost, exits=exits)


def agent_death(code: int | None, log_text: str) -> str:
    """How torchrun's agent itself died, if something outside the launch ended it (pure): killed by a
    signal (its exit status `code` is negative: SIGKILL, or SIGUSR2 that it does not catch), or a
    signal it caught (its log says "got signal": it stopped its ranks and exited); "" otherwise."""
    if code is not None and code < 0:
        return f"torchrun, the launch's agent, {exit_said(code)}"
    caught = caught_signal(code, log_text)
    if caught:
        return f"torchrun, the launch's agent, received {caught}, stopped its ranks and exited with code {code}"
    return ""


def caught_signal(code: int | None, log_text: str) -> str:
    """The signal torchrun's agent caught before it exited with `code` (pure): its log says "got signal",
    or it exited with 128 + the signal's number as a shell does (torch 2.13 exits 143 on SIGTERM, logging
    nothing); "" if neither."""
    said = _AGENT_SIGNAL.search(log_text)
    if said and code:
        return signal_name(int(said.group(2)))
    if code is not None and 128 < code < 128 + 65 and signal_name(code - 128).startswith("SIG"):
        return signal_name(code - 128)
    return ""


def signal_name(number: int) -> str:
    """'SIGTERM' for 15, 'signal 99' for a number no signal has (pure)."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


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


def session_death(code: int, log_text: str, lost_dir=None) -> str:
    """How a session's processes died, from torchrun's exit status `code` and its failure report in the
    session's log: its directory deleted under the ranks (`lost_dir`: they read their jobs there),
    torchrun itself killed by a signal (its ranks go with it), or the rank(s) whose exit took it
    down (pure)."""
    if code < 0:
        return f"torchrun, the session's launcher, {exit_said(code)}, and its ranks went with it"
    caught = caught_signal(code, log_text)
    if caught:
        return f"torchrun, the session's launcher, received {caught} and stopped its ranks (exit code {code})"
    exits = exit_codes(log_text)
    # torchrun SIGTERMs the ranks still running once one fails: those are the consequence, not the cause
    first = {r: c for r, c in exits.items() if c != -signal.SIGTERM} or exits
    gone = f"its directory {lost_dir} was deleted under its ranks, and " if lost_dir else ""
    if first:
        said = "; ".join(f"rank {r} {exit_said(c)}" for r, c in sorted(first.items()))
        rest = sorted(set(exits) - set(first))
        return (f"{gone}{said}, so torchrun stopped " + (f"{rank_list(rest)} and " if rest else "")
                + f"the session (exit code {code})")
    if lost_dir:
        return f"its directory {lost_dir} was deleted under its ranks, and torchrun exited with code {code}"
    return f"torchrun exited with code {code} (see the session's {LOG})"


def rank_list(ranks) -> str:
    """'rank 1' or 'ranks 0, 2' (pure)."""
    ranks = sorted(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))
