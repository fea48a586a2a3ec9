"""Your own torchrun script, started the way the lab starts its ranks:

    result = ddplab.run_script("train.py", "--lr", "0.1", world_size=2)
    print(result.output)            # what torchrun and every rank printed, each rank's lines prefixed
    result.ranks[1]                 # everything rank 1 printed
    result.json_lines()             # the lines the ranks printed as JSON objects, rank by rank

torchrun with its stores on 127.0.0.1 (`launch.loopback`), the ranks' environment as for a lab run
(`torchrun.worker_env`: one OpenMP thread per rank, gloo on loopback), bounded by `timeout_s`, and the
whole process tree killed on timeout, error or interrupt. A script that exits non-zero is returned, not
raised: its output says why (a `ddplab.guard.GuardError` on every rank, say). Nothing it starts outlives
the run, nor the caller (`launch/keeper.py`): if the caller is killed, the ranks and everything they
started are killed at once, and the run's log folder goes too; processes a script that ended
left running are stopped, named in `ScriptRun.stopped` and in a warning.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .keeper import REPORT, warn_left
from .nodes import Nodes
from .torchrun import kill_tree, start, torchrun_argv, worker_env


@dataclass(frozen=True)
class ScriptRun:
    returncode: int
    output: str            # what torchrun printed, each rank's lines prefixed "[rank{r}]:" (torchrun's --tee)
    ranks: dict            # rank -> everything it printed (stdout and stderr), from torchrun's --log-dir
    seconds: float
    stopped: tuple = ()    # command lines of the processes the script left running when it ended (stopped)

    def json_lines(self) -> list[dict]:
        """Every line a rank printed that is a JSON object, parsed, rank by rank."""
        found = []
        for _, text in sorted(self.ranks.items()):
            for line in text.splitlines():
                if line.startswith("{"):
                    try:
                        value = json.loads(line)
                    except json.JSONDecodeError:
                        continue
                    if isinstance(value, dict):
                        found.append(value)
        return found


def run_script(script, *args, world_size: int = 2, timeout_s: float = 300.0) -> ScriptRun:
    """Run `script` (a .py file) with `args` on `world_size` local ranks under torchrun."""
    path = Path(script)
    if not path.is_file() or path.suffix != ".py":
        raise ValueError(f"script: expected a Python file, got {str(script)!r}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or not 1 <= world_size <= 64:
        raise ValueError(f"world_size: expected a whole number of ranks from 1 to 64, got {world_size!r}")
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 < timeout_s < float("inf"):
        raise ValueError(f"timeout_s: expected a positive, finite number of seconds, got {timeout_s!r}")
    target = str(path.resolve())
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ddplab-script-") as logs:
        argv = torchrun_argv(world_size, [str(a) for a in args], script=target, nodes=Nodes())
        at = argv.index(target)   # each rank's output in its own file, and teed line by line, rank-prefixed
        argv[at:at] = [f"--log-dir={logs}", "--redirects=3", "--tee=3"]
        report = Path(logs) / REPORT
        proc = start(argv, worker_env(nodes=Nodes()), subprocess.PIPE, text=True, report=report,
                     orphaned_remove=(logs,))
        try:
            output, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired as late:
            kill_tree(proc, Path(logs))
            said = (late.stdout or "") if isinstance(late.stdout, str) else (late.stdout or b"").decode(errors="replace")
            tail = "\n".join(said.splitlines()[-15:])
            raise TimeoutError(f"{path.name} on {world_size} ranks ran past timeout_s={timeout_s:g} s; torchrun and "
                               f"every rank were stopped. The last lines it printed:\n{tail}") from None
        except BaseException:
            kill_tree(proc, Path(logs))
            raise
        ranks = {}
        for f in sorted(Path(logs).glob("*/attempt_*/*/stdout.log")):
            err = f.with_name("stderr.log")
            ranks[int(f.parent.name)] = f.read_text(errors="replace") + (err.read_text(errors="replace")
                                                                          if err.exists() else "")
        stopped = tuple(warn_left(report, path.name, stacklevel=4))   # the keeper stopped them
    return ScriptRun(proc.returncode, output, ranks, time.perf_counter() - t0, stopped)
