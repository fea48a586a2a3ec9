"""Run any pytest selection with N busy processes on the cores for its whole duration.

    python bench/under_load.py --busy 2 --repeat 3 -- --nbval-lax notebooks exercises

Starts `--busy` processes that spin on the CPU (one busy loop each, as another user's job would),
runs `python -m pytest <args>` `--repeat` times in a row under them, stops them (and their whole
process group) however pytest ends, and appends one line per run to `--log` (default
bench/under_load.log: date, load, busy processes, pytest's exit code, seconds, its summary line), so
the result is written down. Exits with the first non-zero pytest exit code, if any.

With `--claims DIR`, each run's timing verdicts (`$DDPLAB_RECORD_CLAIMS`, see `ddplab/claims.py`) go to
DIR/<date>-run<i>.jsonl, and the log line counts them (held, cannot resolve, contradicted): over the
notebooks, the verdicts of every timing lesson in a loaded suite run (`bench/lesson_counts.py --tally-dir
DIR` tallies them per claim). Over tests/ the count mixes in the tests' synthetic verdicts.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

SPIN = "while True: pass"


@contextlib.contextmanager
def busy_processes(n: int):
    """`n` processes spinning on the cores (another user's jobs) for the `with` block, stopped with their
    whole process group however it ends (a second SIGTERM during the stop is ignored, so none is left)."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # so the stop below runs on SIGTERM too
    busy: list[subprocess.Popen] = []
    try:
        busy += [subprocess.Popen([sys.executable, "-c", SPIN], start_new_session=True) for _ in range(n)]
        yield busy
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for b in busy:
            try:
                os.killpg(b.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            b.wait()


def verdict_counts(record: Path) -> str:
    """"H held, U cannot resolve, C contradicted" over a run's recorded verdicts (read as JSON lines)."""
    rows = [json.loads(ln) for ln in record.read_text().splitlines() if ln.strip()] if record.exists() else []
    n = {o: sum(r.get("outcome") == o for r in rows) for o in ("holds", "cannot resolve", "contradicted")}
    return f"claims {n['holds']} held, {n['cannot resolve']} cannot resolve, {n['contradicted']} contradicted"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--busy", type=int, default=2, help="busy processes on the cores (default 2)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of the selection in a row (default 1)")
    ap.add_argument("--log", type=Path, default=Path(__file__).with_name("under_load.log"))
    ap.add_argument("--claims", type=Path, help="a directory for each run's timing verdicts (one JSONL file a run)")
    ap.add_argument("pytest_args", nargs=argparse.REMAINDER, help="after --: what to give pytest")
    a = ap.parse_args()
    if a.busy < 0:
        raise ValueError(f"--busy must be >= 0, got {a.busy}")
    if a.repeat < 1:
        raise ValueError(f"--repeat must be >= 1, got {a.repeat}")
    args = [x for x in a.pytest_args if x != "--"] or ["tests"]
    first_failure = 0
    with busy_processes(a.busy):
        for i in range(a.repeat):
            env, record = dict(os.environ), None
            if a.claims:   # absolute: the notebooks' kernels run in notebooks/, not here
                a.claims = a.claims.resolve()
                a.claims.mkdir(parents=True, exist_ok=True)
                record = a.claims / f"{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-run{i + 1}.jsonl"
                env["DDPLAB_RECORD_CLAIMS"] = str(record)
            t0 = time.monotonic()
            p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
                               capture_output=True, text=True, env=env)
            seconds = time.monotonic() - t0
            summary = next((ln for ln in reversed(p.stdout.splitlines()) if " in " in ln and ("passed" in ln
                            or "failed" in ln or "error" in ln)), "(no summary line)")
            line = (f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} load {os.getloadavg()[0]:.1f} busy {a.busy} "
                    f"run {i + 1}/{a.repeat} rc {p.returncode} {seconds:.0f} s: {summary.strip()} [{' '.join(args)}]"
                    + (f"; {verdict_counts(record)} ({record.name})" if record else ""))
            print(line, flush=True)
            with a.log.open("a") as f:
                f.write(line + "\n")
            if p.returncode and not first_failure:
                first_failure = p.returncode
                print(p.stdout[-4000:], file=sys.stderr)
    return first_failure


if __name__ == "__main__":
    sys.exit(main())
