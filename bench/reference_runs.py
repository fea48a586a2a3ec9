"""Make the reference runs that notebooks show beside a claim this run could not resolve.

    python bench/reference_runs.py                         # notebooks 03-11, once each
    python bench/reference_runs.py --repeat 3 notebooks/05_buckets_and_overlap.ipynb

Executes each notebook (nbconvert, in a scratch copy: the notebook in the repository is left as it is,
unless `--inplace` asks to store the outputs in it)
with `$DDPLAB_RECORD_CLAIMS` pointing at a scratch file, so every timing claim's verdict is written
down, and its runs under a scratch `$DDPLAB_RUNS`, whose `spec.json` files say which link each run used.
Every claim that held, in a run that went through, replaces the stored verdict of the same claim in
`ddplab/references/claims.json`, together with the run's machine (cores, CPU model), load average,
links, date, torch version and commit; any other claim keeps the reference it had, unless a run of its
notebook that went through no longer makes it (reworded or gone): that one is dropped. With `--repeat`,
a notebook is run again while some of its claims are unresolved. Run it on a quiet machine. Prints a
line per notebook run: claims seen, resolved, and how long it took.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from ddplab.references import REFERENCES  # noqa: E402

DEFAULT = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "notebooks").glob("*.ipynb") if "03" <= p.name[:2] <= "11")


def machine() -> str:
    model = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                  if ln.startswith("model name")), platform.processor() or "?") if Path("/proc/cpuinfo").exists() else "?"
    return f"{os.cpu_count()} cores, {model}"


def commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        return out.stdout.strip() + ("+changes" if dirty else "")
    except OSError:
        return "?"


def links(runs_dir: Path, since: float = 0.0) -> dict[str, str]:
    """Run name -> the link its all-reduces used, from each run's spec.json written after `since`
    (read as plain JSON)."""
    out = {}
    for spec in sorted(runs_dir.rglob("spec.json")):
        try:
            if spec.stat().st_mtime < since:
                continue
            d = json.loads(spec.read_text())
        except (OSError, ValueError):
            continue
        link = d.get("link") if isinstance(d, dict) else None
        out[str(d.get("name", spec.parent.name))] = (
            f"emulated link {link.get('name')} ({link.get('latency_us')} us, {link.get('gbit_s')} Gb/s)"
            if isinstance(link, dict) else "loopback")
    return out


def run_notebook(nb: Path, scratch: Path, inplace: bool = False) -> tuple[list[dict], dict, float, int]:
    record, runs = scratch / "claims.jsonl", scratch / "runs"
    record.unlink(missing_ok=True)
    env = {**os.environ, "DDPLAB_RECORD_CLAIMS": str(record), "DDPLAB_RUNS": str(runs)}
    where = ["--output-dir", str(scratch), "--output", "executed"]
    if inplace:   # the outputs as a learner's run leaves them: runs under the notebook's own runs/
        where, runs = ["--inplace"], Path(os.environ.get("DDPLAB_RUNS", nb.parent / "runs"))
        env["DDPLAB_RUNS"] = str(runs)
    load = os.getloadavg()[0]
    started = time.time()
    t0 = time.monotonic()
    # a session of its own, so that however this script ends (Ctrl-C, SIGTERM), the notebook's kernel and
    # the ranks it launched go with it: no orphans
    # 300 s a cell: the slowest cell takes about 80 s under 2 busy processes; a longer wait is a stall. One seen
    # here, 2026-12-07, with ipykernel 7.4.0: the kernel idle, its ranks idle, the client waiting for an
    # execute_reply that never came (as ipython/ipykernel#1554 describes a shell request left unread)
    p = subprocess.Popen([sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute",
                          "--ExecutePreprocessor.timeout=300", *where, str(nb)], cwd=nb.parent, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    stderr = ""
    try:
        _, stderr = p.communicate()
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)   # whatever is left of its tree (nothing, after a clean exit)
        except (ProcessLookupError, PermissionError):
            pass
        p.wait()
    seconds = time.monotonic() - t0
    verdicts = [json.loads(ln) for ln in record.read_text().splitlines()] if record.exists() else []
    meta = {"load": f"{load:.1f} at start, {os.getloadavg()[0]:.1f} at end", "links": links(runs, started)}
    if p.returncode:
        print(stderr[-3000:], file=sys.stderr)
    if inplace:
        coalesce_streams(nb)
    return verdicts, meta, seconds, p.returncode


def coalesce_streams(nb: Path) -> None:
    """One stream output per run of prints, as JupyterLab shows a cell: nbconvert's own coalescing runs
    before the kernel, not on what it printed, and a print's newline can arrive as an output of its own."""
    d = json.loads(nb.read_text())
    for cell in d["cells"]:
        merged = []
        for o in cell.get("outputs", []):
            if merged and o["output_type"] == "stream" == merged[-1]["output_type"] and o["name"] == merged[-1]["name"]:
                merged[-1]["text"] = "".join(merged[-1]["text"]) + "".join(o["text"])
            else:
                merged.append(o)
        if "outputs" in cell:
            cell["outputs"] = merged
    nb.write_text(json.dumps(d, indent=1, ensure_ascii=False) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="*", default=DEFAULT)
    ap.add_argument("--repeat", type=int, default=1, help="runs of a notebook at most, while claims stay unresolved")
    ap.add_argument("--out", type=Path, default=REFERENCES)
    ap.add_argument("--inplace", action="store_true",
                    help="store the executed notebook's outputs in the notebook itself (its runs still go to scratch)")
    a = ap.parse_args()
    if a.repeat < 1:
        raise ValueError(f"--repeat must be >= 1, got {a.repeat}")
    store = json.loads(a.out.read_text()) if a.out.exists() else {}
    store.setdefault("runs", {})
    store.setdefault("claims", {})
    store["about"] = ("Verdicts of timing claims from real runs that resolved them, shown beside a learner's "
                      "unresolved claim (ddplab.references.reference); made by bench/reference_runs.py. Data only.")
    code = 0
    for name in a.notebooks:
        nb = (ROOT / name).resolve()
        for i in range(a.repeat):
            with tempfile.TemporaryDirectory(prefix="ddplab-ref-") as tmp:
                verdicts, meta, seconds, rc = run_notebook(nb, Path(tmp), a.inplace)
            run_id = f"{nb.stem}@{datetime.now(timezone.utc):%Y-%m-%dT%H:%M:%SZ}"
            # a reference shows what the lesson looks like when it resolves: a claim that held, in a run
            # that went through (a contradicted claim failed its cell, and is the run's news, not a reference);
            # an open question a table shows (`claims.noted`) is resolved by either answer
            resolved = [v for v in verdicts if v["outcome"] == "holds" or (v.get("finding") and v["outcome"] == "contradicted")
                        ] if rc == 0 else []
            if resolved:
                store["runs"][run_id] = {"notebook": nb.name, "machine": machine(), "date": f"{datetime.now(timezone.utc):%Y-%m-%d}",
                                         "commit": commit(), "python": platform.python_version(),
                                         "torch": _torch_version(), **meta}
            for v in resolved:
                store["claims"][v["key"]] = {"run": run_id, "line": v["line"], "outcome": v["outcome"], "seen": v.get("seen", "")}
            if rc == 0:   # a claim this notebook no longer makes (reworded, or gone) keeps no reference
                seen = {v["key"] for v in verdicts}
                store["claims"] = {k: e for k, e in store["claims"].items() if k in seen or
                                   store["runs"].get(e.get("run"), {}).get("notebook") != nb.name}
            unresolved = {v["key"] for v in verdicts} - {v["key"] for v in resolved} - set(store["claims"])
            print(f"{nb.name} run {i + 1}: {len(verdicts)} claims, {len(resolved)} resolved, {len(unresolved)} without "
                  f"any reference yet; rc {rc}, {seconds:.0f} s, load {meta['load']}", flush=True)
            code = code or rc
            if not unresolved:
                break
    used = {v["run"] for v in store["claims"].values()}
    store["runs"] = {k: v for k, v in store["runs"].items() if k in used}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(store, indent=1, sort_keys=True) + "\n")
    return code


def _torch_version() -> str:
    try:
        from importlib.metadata import version
        return version("torch")
    except Exception:  # noqa: BLE001 - a label only
        return "?"


if __name__ == "__main__":
    sys.exit(main())
