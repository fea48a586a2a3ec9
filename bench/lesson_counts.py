"""Count how often each timing lesson resolves: run notebooks N times (optionally under load) and tally
every claim's verdict.

    python bench/lesson_counts.py --runs 10 --busy 0 notebooks/05_buckets_and_overlap.ipynb
    python bench/lesson_counts.py --runs 10 --busy 2 notebooks/0[579]_*.ipynb

Each run executes the notebook with nbconvert in a scratch copy (as `bench/reference_runs.py` does:
`$DDPLAB_RECORD_CLAIMS` collects every verdict `claims.check` prints, its runs go to a scratch
`$DDPLAB_RUNS`), with `--busy` processes spinning on the cores for the whole batch (as another user's
jobs would). The notebooks import the `ddplab` beside this script (`PYTHONPATH`), so a batch can run
from a git worktree of a fixed commit while the main checkout changes. Appends one JSON line per run to
`--out` (default bench/lesson_counts.jsonl: notebook, busy, load, seconds, exit code, each claim's
outcome) and prints, per notebook and claim, how many runs held it, could not resolve it or
contradicted it. `--tally` only prints the tally of what `--out` holds (optionally for one `--busy`).
`--tally-dir DIR` tallies the verdict files of suite runs (`bench/under_load.py --claims DIR`: one file
a run of the notebook suite), each claim under the notebook that `--out`'s rows saw it in; whether a
suite run passed is in bench/under_load.log.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from reference_runs import commit, run_notebook  # noqa: E402
from under_load import busy_processes  # noqa: E402


def tally(rows: list[dict], busy: int | None = None) -> str:
    """Per notebook and claim key: held / cannot resolve / contradicted, over the runs that recorded it,
    and the runs whose notebook failed."""
    rows = [r for r in rows if busy is None or r["busy"] == busy]
    out = []
    for nb in sorted({r["notebook"] for r in rows}):
        runs = [r for r in rows if r["notebook"] == nb]
        failed = sum(r["rc"] != 0 for r in runs)
        loads = sorted(r["load_start"] for r in runs)
        if all(r["busy"] == -1 for r in runs):   # suite runs (`suite_rows`): no load or time of their own here
            out.append(f"## {nb}: {len(runs)} suite runs")
        else:
            out.append(f"## {nb}: {len(runs)} runs (busy {sorted({r['busy'] for r in runs})}), {failed} failed; "
                       f"load at start {loads[0]:.1f}-{loads[-1]:.1f}; "
                       f"{sum(r['seconds'] for r in runs) / len(runs):.0f} s a run")
        counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        open_questions = set()
        for r in runs:
            seen = {}
            for key, outcome, *finding in r["claims"]:
                seen.setdefault(key, []).append(outcome)
                if finding and finding[0]:
                    open_questions.add(key)
            for key, outcomes in seen.items():   # a claim checked twice in one run counts by its weakest
                worst = ("contradicted" if "contradicted" in outcomes else
                         "cannot resolve" if "cannot resolve" in outcomes else "holds")
                counts[key][worst] += 1
        checked = [k for k in counts if k not in open_questions]
        resolving = [k for k in checked if sum(counts[k].values()) and
                     (counts[k]["holds"] + counts[k]["contradicted"]) >= 0.9 * sum(counts[k].values())]
        out.append(f"  claims resolved in at least 9 of 10 runs: {len(resolving)} of {len(checked)}; "
                   f"open questions a table answers (yes, the opposite or not resolved): {len(open_questions)}")
        for key, c in counts.items():
            n = sum(c.values())
            if key in open_questions:
                out.append(f"  question: yes {c['holds']:2d}/{n}, the opposite {c['contradicted']}, not resolved "
                           f"{c['cannot resolve']:2d}: {key[:150]}")
            else:
                out.append(f"  held {c['holds']:2d}/{n}, unresolved {c['cannot resolve']:2d}, contradicted "
                           f"{c['contradicted']}: {key[:150]}")
    return "\n".join(out)


def read_rows(path: Path) -> list[dict]:
    """The JSON lines of `path` (blank lines skipped), read as data."""
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def suite_rows(folder: Path, known: list[dict]) -> list[dict]:
    """One row per (verdict file, notebook), in `tally`'s shape, from the verdict files of suite runs: each
    claim goes to the notebook a row of `known` recorded it in ("(other)" where none did)."""
    where = {c[0]: r["notebook"] for r in known for c in r["claims"]}
    rows = []
    for f in sorted(folder.glob("*.jsonl")):
        verdicts = read_rows(f)
        by_nb: dict[str, list] = defaultdict(list)
        for v in verdicts:
            by_nb[where.get(v["key"], "(other)")].append([v["key"], v["outcome"], bool(v.get("finding"))])
        rows += [{"notebook": nb, "run": f.stem, "busy": -1, "load_start": 0.0, "seconds": 0.0, "rc": 0,
                  "claims": claims} for nb, claims in by_nb.items()]
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="*")
    ap.add_argument("--runs", type=int, default=10, help="runs of each notebook (default 10)")
    ap.add_argument("--busy", type=int, default=0, help="busy processes on the cores for the whole batch")
    ap.add_argument("--out", type=Path, default=HERE / "lesson_counts.jsonl")
    ap.add_argument("--tally", action="store_true", help="print the tally of --out and stop")
    ap.add_argument("--tally-dir", type=Path, help="tally the suite runs' verdict files in this directory and stop")
    a = ap.parse_args()
    if a.runs < 1:
        raise ValueError(f"--runs must be >= 1, got {a.runs}")
    if a.busy < 0:
        raise ValueError(f"--busy must be >= 0, got {a.busy}")
    if a.tally_dir:
        print(f"suite runs in {a.tally_dir} (busy, load, time and pass/fail: bench/under_load.log)")
        print(tally(suite_rows(a.tally_dir, read_rows(a.out) if a.out.exists() else [])))
        return 0
    if a.tally:
        print(tally(read_rows(a.out), None if "--busy" not in sys.argv else a.busy))
        return 0
    if not a.notebooks:
        raise ValueError("notebooks: name at least one notebook to run")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    rows, code = [], 0
    with busy_processes(a.busy):
        for i in range(a.runs):
            for name in a.notebooks:
                nb = Path(name).resolve()
                load = os.getloadavg()[0]
                with tempfile.TemporaryDirectory(prefix="ddplab-counts-") as tmp:
                    verdicts, meta, seconds, rc = run_notebook(nb, Path(tmp))
                row = {"notebook": nb.name, "run": i + 1, "busy": a.busy, "load_start": round(load, 2),
                       "load_end": round(os.getloadavg()[0], 2), "seconds": round(seconds, 1), "rc": rc,
                       "date": f"{datetime.now(timezone.utc):%Y-%m-%dT%H:%M:%SZ}", "commit": commit(),
                       "claims": [[v["key"], v["outcome"], bool(v.get("finding"))] for v in verdicts]}
                rows.append(row)
                with a.out.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                held = sum(v["outcome"] == "holds" for v in verdicts if not v.get("finding"))
                print(f"{nb.name} run {i + 1}/{a.runs} busy {a.busy}: rc {rc}, {seconds:.0f} s, load {load:.1f}; "
                      f"{held} of {sum(not v.get('finding') for v in verdicts)} claims held, "
                      f"{sum(v['outcome'] == 'contradicted' for v in verdicts if not v.get('finding'))} contradicted; "
                      f"{sum(bool(v.get('finding')) for v in verdicts)} open questions", flush=True)
                code = code or rc
    print(tally(rows))
    return code


if __name__ == "__main__":
    sys.exit(main())
