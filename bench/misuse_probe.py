"""Issue 30's fault-and-misuse probe, rerun: feed the lab misuse, damaged and malicious files, faults
and signals, and count the outcomes per category.

    python bench/misuse_probe.py                    # every category (about 10 minutes on 2 cores)
    python bench/misuse_probe.py --only fuzz files  # some of them
    python bench/misuse_probe.py --fuzz-examples 500
    python bench/misuse_probe.py --only owned guard deaths sessions gradients refusals   # issue 51's round

Each case ends in one of:
- clear: a ValueError (naming the field, for the constructor fuzz), a `RunFailed` diagnosis, a
  `CheckFailed`, a `CellFailed`, or for the command line a one-line `error:` and a non-zero exit;
- accepted: it ran (the fuzz also checks that an accepted spec round-trips through JSON: "wrong" if not);
- raw: any other exception (AttributeError, TypeError, RecursionError, a traceback on the command line...);
- code ran: a marker file that only a malicious file's code would write exists afterwards.
At the end it counts the lab's processes left alive (torchrun agents and ranks): it must be 0.
It prints one line per category and every raw case in full, appends a JSON line to
bench/misuse_probe.jsonl, and exits 1 if any case was raw, ran code, or left a process.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ddplab  # noqa: E402
from ddplab import Experiment, recipes, tables  # noqa: E402
from ddplab.failures import Interrupted, RunFailed  # noqa: E402
from ddplab.verify import CheckFailed  # noqa: E402

CLEAR = (ValueError, RunFailed, CheckFailed, Interrupted)


class Tally:
    def __init__(self):
        self.counts: dict[str, dict[str, int]] = {}
        self.raw: list[str] = []

    def add(self, category: str, outcome: str, case: str = "", detail: str = "") -> None:
        c = self.counts.setdefault(category, {})
        c[outcome] = c.get(outcome, 0) + 1
        if outcome in ("raw", "code ran", "wrong", "left a process"):
            self.raw.append(f"[{category}] {outcome}: {case}\n    {detail}")

    def call(self, category: str, case: str, fn, clear=CLEAR, marker: Path | None = None) -> str:
        try:
            fn()
            outcome, detail = "accepted", ""
        except clear as e:
            outcome, detail = "clear", f"{type(e).__name__}: {e}"
            if "cannot read this:" in str(e):   # a table's last resort (tables/reads.py), not a declared check
                outcome = "clear (caught late)"
        except RecursionError as e:
            outcome, detail = "raw", f"RecursionError: {str(e)[:200]}"
        except Exception as e:  # noqa: BLE001 - the probe counts exactly these
            outcome = "raw"
            detail = f"{type(e).__name__}: {str(e)[:300]}\n" + "".join(traceback.format_tb(e.__traceback__)[-3:])
        if marker is not None and marker.exists():
            outcome = "code ran"
            marker.unlink()
        self.add(category, outcome, case, detail)
        if outcome.startswith(os.environ.get("PROBE_SHOW", "-")):
            print(f"  {outcome} [{category}] {case}: {detail[:300]}")
        return outcome


# ---- 1. constructor fuzz ----------------------------------------------------------------------------
def fuzz(t: Tally, examples: int) -> None:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    fields = [f.name for f in dataclasses.fields(Experiment)]
    scalars = st.one_of(
        st.none(), st.booleans(), st.integers(-2**70, 2**70), st.sampled_from([0, 1, -1, 2, 3, 4, 10**9, 2**31]),
        st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, -0.0, 1e-300, 1e308, 0.5, 25.0]),
        st.text(max_size=12), st.sampled_from(["ddp", "none", "float64", "gloo", "cpu", "auto", "transformer",
                                               "mlp", "sgd", "adam", "zero1", "fsdp2", "rank-mean", "x:y", "os:system"]))
    values = st.one_of(scalars, st.lists(scalars, max_size=4).map(tuple), st.lists(scalars, max_size=3),
                       st.dictionaries(st.text(max_size=6), scalars, max_size=3))
    task_kinds = sorted(__import__("ddplab.spec.tasks", fromlist=["x"])._REGISTRY) + ["zz", ""]
    nested = st.fixed_dictionaries({"kind": st.one_of(st.sampled_from(task_kinds), scalars)},
                                   optional={k: values for k in ("module", "rank", "step", "ms", "where", "name",
                                                                 "latency_us", "gbit_s", "save_at", "resume_from",
                                                                 "restore", "sampler_position")})

    def judge(build, case, keys):
        def fn():
            exp = build()
            again = Experiment.from_json(exp.to_json())
            if again != exp:
                raise _Wrong(f"round trip changed it: {exp!r} -> {again!r}")
        try:
            fn()
            t.add("fuzz", "accepted")
        except _Wrong as e:
            t.add("fuzz", "wrong", case, str(e)[:300])
        except ValueError as e:
            named = any(str(f) in str(e) for f in [*keys, "task", "kind", "fault", "link", "straggler", "spec"])
            t.add("fuzz", "clear" if named else "unnamed", case, str(e)[:200])
            if not named:
                t.raw.append(f"[fuzz] a ValueError that names no field: {case}\n    {e}")
        except Exception as e:  # noqa: BLE001
            t.add("fuzz", "raw", case, f"{type(e).__name__}: {str(e)[:300]}")

    per = max(1, examples // 2)

    @settings(max_examples=per, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.dictionaries(st.sampled_from(fields), values, min_size=1, max_size=4))
    def keyword(kw):
        judge(lambda: Experiment(**kw), f"Experiment(**{kw!r})"[:300], list(kw))

    @settings(max_examples=per, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.dictionaries(st.sampled_from(fields + ["zz"]), st.one_of(values, nested), min_size=1, max_size=4))
    def from_dict(d):
        judge(lambda: Experiment.from_dict(json.loads(json.dumps(d, default=str))), f"from_dict({d!r})"[:300], list(d))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        keyword()
        from_dict()


class _Wrong(Exception):
    pass


# ---- 2. runs to read ---------------------------------------------------------------------------------
def make_runs(tmp: Path) -> dict[str, "ddplab.Run"]:
    """Three real 2-rank runs of different kinds: the tables and the damaged files read them."""
    runs = {
        "plain": ddplab.run(Experiment(name="plain", world_size=2, steps=2), tmp / "plain", progress=False,
                            warm=False),
        "probed": ddplab.run(Experiment(name="probed", world_size=2, steps=3,
                                        probes=("reference", "gradients", "buckets", "memory", "readiness", "bytes")),
                             tmp / "probed", progress=False, warm=False),
        "sweep": ddplab.run(recipes.allreduce_sweep(2, max_bytes=64 * 1024, repeats=3), tmp / "sweep",
                            progress=False, warm=False),
    }
    return runs


# ---- 3. the results API on runs it is not for --------------------------------------------------------
RUNNY = {"run", "runs", "reference", "resumed", "saved", "ddp_run", "compute_only_run", "weak_runs",
         "strong_runs", "memory_runs", "allreduce_run", "baseline"}


def table_functions():
    import ddplab.tables as T

    seen = {}
    for name in T.__all__:
        obj = getattr(T, name)
        if inspect.ismodule(obj):
            for n, f in vars(obj).items():
                if inspect.isfunction(f) and f.__module__ == obj.__name__ and not n.startswith("_"):
                    seen[f"tables.{name}.{n}"] = f
        elif callable(obj):
            seen[f"tables.{name}"] = obj
    for mod in ("bucket_sweep", "buckets", "stragglers"):
        m = __import__(f"ddplab.tables.{mod}", fromlist=["x"])
        for n, f in vars(m).items():
            if inspect.isfunction(f) and f.__module__ == m.__name__ and not n.startswith("_"):
                seen.setdefault(f"tables.{mod}.{n}", f)
    return seen


def results_api(t: Tally, runs: dict) -> None:
    skipped = 0
    for label, f in table_functions().items():
        params = list(inspect.signature(f).parameters.values())
        required = [p for p in params if p.default is inspect.Parameter.empty]
        if not required or any(p.name not in RUNNY for p in required):
            skipped += 1
            continue
        for kind, run in runs.items():
            args = [[run] if p.name.endswith("runs") else run for p in required]
            t.call("results API", f"{label}({kind} run)", lambda: f(*args))
            if any(p.name.endswith("runs") for p in required):
                t.call("results API", f"{label}([] )", lambda: f(*[[] if p.name.endswith("runs") else run
                                                                    for p in required]))
            t.call("results API", f"{label}(a string for a run)", lambda: f(*["runs/nothing" for _ in required]))
    t.counts.setdefault("results API", {})["(tables needing other arguments, not fed)"] = skipped


# ---- 4. damaged run directories ----------------------------------------------------------------------
DAMAGES = {
    "deleted": lambda p: _rm(p),
    "empty": lambda p: _write(p, b""),
    "[]": lambda p: _write(p, b"[]"),
    "null": lambda p: _write(p, b"null"),
    "{}": lambda p: _write(p, b"{}"),
    "a number": lambda p: _write(p, b"1e999"),
    "truncated": lambda p: _write(p, p.read_bytes()[: max(1, p.stat().st_size // 2)]),
    "binary": lambda p: _write(p, bytes(range(256)) * 4),
    "nested deep": lambda p: _write(p, b"[" * 100000 + b"]" * 100000),
    "a directory": lambda p: (_rm(p), p.mkdir()),
    "a symlink to /etc/passwd": lambda p: (_rm(p), p.symlink_to("/etc/passwd")),
}


def _rm(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p)
    else:
        p.unlink()


def _write(p: Path, data: bytes) -> None:
    _rm(p)
    p.write_bytes(data)


def _mutations(d: dict, prefix=""):
    """Every top-level (and envelope-level) key of a JSON record set to a wrong type."""
    for k, v in d.items():
        for wrong in (None, "x", [], {}, -1, 1e308):
            if wrong != v:
                yield f"{prefix}{k}={wrong!r}", k, wrong
        if isinstance(v, dict) and not prefix:
            for sub, k2, wrong in _mutations(v, prefix=f"{k}."):
                yield sub, (k, k2), wrong


def _read_all(path: Path) -> None:
    run = ddplab.load_run(path)
    tables.ranks.rank_table(run)
    tables.ranks.steps(run)
    tables.gradients.gradient_check(run)
    tables.memory.memory_table(run)
    tables.readiness.ready_order(run)
    tables.comm.bytes_on_wire([run])


def damaged_files(t: Tally, runs: dict, tmp: Path) -> None:
    src = Path(runs["probed"].path)
    files = sorted(p.relative_to(src) for p in src.rglob("*") if p.is_file())
    n = 0
    for rel in files:
        for what, damage in DAMAGES.items():
            copy = tmp / f"damaged{n}"
            n += 1
            shutil.copytree(src, copy, symlinks=True)
            damage(copy / rel)
            t.call("damaged files", f"{rel}: {what}", lambda: _read_all(copy))
            shutil.rmtree(copy)
        if rel.suffix == ".json":
            record = json.loads((src / rel).read_text())
            if isinstance(record, dict):
                for case, key, wrong in _mutations(record):
                    copy = tmp / f"damaged{n}"
                    n += 1
                    shutil.copytree(src, copy, symlinks=True)
                    changed = json.loads(json.dumps(record))
                    if isinstance(key, tuple):
                        changed[key[0]][key[1]] = wrong
                    else:
                        changed[key] = wrong
                    (copy / rel).write_text(json.dumps(changed))
                    t.call("damaged files", f"{rel}: {case}", lambda: _read_all(copy))
                    shutil.rmtree(copy)


# ---- 5. malicious files: nothing the lab reads may run code ------------------------------------------
class _Marker:
    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (Path.write_text, (Path(self.path), "code ran"))


def malicious(t: Tally, runs: dict, tmp: Path) -> None:
    from ddplab.spec.resume import checkpoint_dir

    marker = tmp / "marker"
    payload = pickle.dumps(_Marker(marker))
    # a real saving run, so its checkpoint is sealed as the lab writes one
    saved = ddplab.run(recipes.resume.resume_baseline(2, save_at=2)[1], tmp / "saving", progress=False, warm=False)
    ckpt = checkpoint_dir(saved.path)
    for f in sorted(p for p in ckpt.iterdir() if p.is_file()):
        copy = shutil.copytree(saved.path, tmp / f"evil-{f.name}")
        (checkpoint_dir(copy) / f.name).write_bytes(payload)
        t.call("malicious files", f"checkpoint/{f.name} replaced by a pickle, resumed",
               lambda: ddplab.run(recipes.resume.resumes(copy)[0], tmp / f"out-{f.name}", progress=False, warm=False),
               marker=marker)
        t.call("malicious files", f"checkpoint/{f.name} replaced by a pickle, the saving run loaded",
               lambda: ddplab.load_run(copy), marker=marker)
    # seal files themselves
    for f in sorted(p for p in Path(saved.path).iterdir() if p.is_file() and "seal" in p.name):
        copy = shutil.copytree(saved.path, tmp / f"evil-seal-{f.name}")
        (copy / f.name).write_bytes(payload)
        t.call("malicious files", f"{f.name} replaced by a pickle, resumed",
               lambda: recipes.resume.resumes(copy), marker=marker)
    # a spec naming a module to import
    evil = tmp / "evilmods"
    evil.mkdir()
    (evil / "evilmod_probe.py").write_text(f"open({str(marker)!r}, 'w').write('code ran')\n")
    sys.path.insert(0, str(evil))
    try:
        for task in ({"kind": "zz", "module": "evilmod_probe"}, {"kind": "train", "module": "evilmod_probe"},
                     {"kind": "evilmod_probe:x"}, {"kind": "train", "factory": "evilmod_probe:make"}):
            copy = shutil.copytree(runs["plain"].path, tmp / f"evil-spec-{len(list(tmp.iterdir()))}")
            spec = json.loads((copy / "spec.json").read_text())
            spec["task"] = task
            (copy / "spec.json").write_text(json.dumps(spec))
            t.call("malicious files", f"spec.json task {task}: load_run", lambda: ddplab.load_run(copy), marker=marker)
            t.call("malicious files", f"spec.json task {task}: ddplab run --spec",
                   lambda: _cli_ok(["run", "--spec", str(copy / "spec.json")], env={"PYTHONPATH": str(evil)}),
                   marker=marker)
        for field, value in (("model", "evilmod_probe:make"), ("model", "os:system")):
            spec = json.loads((Path(runs["plain"].path) / "spec.json").read_text())
            spec[field] = value
            t.call("malicious files", f"spec.json {field}={value}: from_dict",
                   lambda: Experiment.from_dict(spec), marker=marker)
    finally:
        sys.path.remove(str(evil))
    # pickles where the lab reads tensors or records
    for name in ("rank0.pt", "rank1.pt", "rank0.json", "launch.json"):
        copy = shutil.copytree(runs["probed"].path, tmp / f"evil-{name}")
        (copy / name).write_bytes(payload)
        t.call("malicious files", f"{name} replaced by a pickle", lambda: _read_all(copy), marker=marker)
    # a flight recorder dump in a launch directory
    from ddplab import deaths

    fr = tmp / "fr"
    fr.mkdir()
    (fr / f"{deaths.FLIGHT_PREFIX}0").write_bytes(payload)
    t.call("malicious files", "a flight-recorder dump that is a pickle", lambda: deaths.flight_records(fr, 2),
           marker=marker)


def _cli_ok(argv, env=None, timeout=120) -> None:
    """Run `python -m ddplab argv`: raise ValueError (clear) on a one-line refusal, RuntimeError on a traceback."""
    p = subprocess.run([sys.executable, "-m", "ddplab", *argv], capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, **(env or {})}, cwd=ROOT)
    text = p.stdout + p.stderr
    if "Traceback (most recent call last)" in text:
        raise RuntimeError(f"rc {p.returncode}, a traceback: {text[-600:]}")
    if p.returncode != 0:
        raise ValueError(f"rc {p.returncode}: {text.strip().splitlines()[-1] if text.strip() else '(nothing said)'}")


# ---- 6. the command line -----------------------------------------------------------------------------
CLI = [
    ["audit", "--world-size", "1"], ["audit", "--json", "/etc"], ["tune-buckets", "--caps", "inf"],
    ["tune-buckets", "--caps", "1e400"], ["tune-buckets", "--caps", "-1"], ["tune-buckets", "--caps", "x"],
    ["run", "--spec", "/nonexistent"], ["run", "--spec", "/etc"], ["run", "--spec", "/etc/passwd"],
    ["run", "--lr", "1e308"], ["run", "--lr", "nan"], ["run", "--lr", "-1"], ["run", "--world-size", "0"],
    ["run", "--world-size", "100000"], ["run", "--local-batch", "100000000"], ["run", "--steps", "-3"],
    ["run", "--seq-len", "0"], ["run", "--dtype", "float8"], ["run", "--sync", "maybe"], ["run", "--fault", "x"],
    ["run", "--link", "nonsense"], ["run", "--bucket-cap-mb", "nan"], ["run", "--timeout-s", "-1"],
    ["run", "--out", "/etc"], ["run", "--out", "."], ["run", "--import", "no_such_module_xyz"],
    ["audit", "--model", "tests.support.user_models:counted", "--local-batch", "100000", "--seq-len", "1024"],
    ["audit", "--factory", "os:system"], ["audit", "--factory", "nope"],
    ["slurm", "--nodes", "0"], ["doctor", "--world-size", "-2"], ["nonsense-command"],
]


def cli(t: Tally) -> None:
    for argv in CLI:
        t.call("command line", " ".join(argv), lambda: _cli_ok(argv, timeout=180))
    t.call("command line", "DDPLAB_NODES=9 run --world-size 4",
           lambda: _cli_ok(["run", "--world-size", "4", "--steps", "1"], env={"DDPLAB_NODES": "9"}))


# ---- 7. faults and signals ---------------------------------------------------------------------------
def faults(t: Tally, tmp: Path) -> None:
    from ddplab.spec.fault import FAULT_KINDS, Fault

    for kind in FAULT_KINDS:
        def provoke():
            step = 0 if kind == "shape-mismatch" else 1
            exp = Experiment(name=f"fault-{kind}", world_size=2, steps=2, fault=Fault(kind, rank=1, step=step),
                             timeout_s=5)
            ddplab.run(exp, tmp / f"fault-{kind}", progress=False, warm=False)
        t.call("faults and signals", f"fault {kind}", lambda: _expect_failed(provoke))
    script = ("import ddplab, sys; ddplab.run(ddplab.Experiment(world_size=2, steps=200, local_batch=4), "
              "sys.argv[1], progress=False, warm=False)")
    for sig in (signal.SIGINT, signal.SIGTERM):
        for delay in (0.5, 3.0, 6.0):
            t.call("faults and signals", f"{sig.name} to the launcher after {delay} s",
                   lambda: _signalled(script, tmp / f"sig-{sig.name}-{delay}", sig, delay))
    t.call("faults and signals", "two SIGINTs 50 ms apart after 4 s",
           lambda: _signalled(script, tmp / "sig-double", signal.SIGINT, 4.0, again_after=0.05))


def _expect_failed(fn) -> None:
    try:
        fn()
    except RunFailed:
        raise
    raise _Wrong("a faulty run reported success")


def _signalled(script: str, out: Path, sig, delay: float, again_after: float | None = None) -> None:
    p = subprocess.Popen([sys.executable, "-c", script, str(out)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, cwd=ROOT, start_new_session=True)
    time.sleep(delay)
    p.send_signal(sig)
    if again_after is not None:
        time.sleep(again_after)
        p.send_signal(sig)
    try:
        text, _ = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        raise RuntimeError(f"the launcher did not stop within 60 s of {sig.name}")
    time.sleep(0.5)
    left = _lab_processes()
    if left:
        raise RuntimeError(f"processes left after {sig.name}: {left}")
    if "Traceback" in text and "Interrupted" not in text and "KeyboardInterrupt" not in text:
        raise RuntimeError(f"a traceback: {text[-600:]}")
    raise ValueError(f"stopped by {sig.name}, rc {p.returncode}")


PROBE_MARK = "DDPLAB_MISUSE_PROBE"   # set in this process, inherited by all it starts: other work is not counted


def _lab_processes() -> list[str]:
    """The lab's processes (torchrun agents, keepers, ranks) that this probe started, wherever they were
    reparented to: found by the variable every descendant inherits, so a test suite or another probe
    running beside this one is not counted."""
    import psutil

    mark, out = os.environ.get(PROBE_MARK), []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if not any(k in cmd for k in ("ddplab.rank", "torch.distributed.run", "torchrun", "ddplab.launch")):
            continue
        try:
            if p.pid != os.getpid() and (mark is None or p.environ().get(PROBE_MARK) == mark):
                out.append(f"{p.pid}: {cmd[:100]}")
        except (psutil.Error, OSError):
            pass
    return out


# ---- 8. %%ddp cells and the idle deadline ------------------------------------------------------------
CELLS = [
    "if rank != 0:\n    dist.all_reduce(torch.ones(1))",
    "if rank == 1:\n    while True:\n        pass\nelse:\n    dist.all_reduce(torch.ones(3))",
    "dist.all_reduce(torch.ones(4 if rank == 0 else 8))",
    "import os, signal\nif rank == 0:\n    os.kill(os.getppid(), signal.SIGKILL)\nimport time; time.sleep(2)",
    "import os\nif rank == 1:\n    os._exit(3)\nimport time; time.sleep(2)",
    "raise RuntimeError('mine')",
    "1/0 if rank else None",
    "import sys; sys.exit(2)",
    "dist.destroy_process_group()",
]


def cells(t: Tally) -> None:
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    from ddplab.magic import CellFailed

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "ddplab")
    for code in CELLS:
        ip.run_line_magic("ddp_start", "-n 2 --timeout 3")
        with capture_output():
            t.call("%%ddp cells", code.replace("\n", "; "), lambda: ip.run_cell_magic("ddp", "", code),
                   clear=CLEAR + (CellFailed,))
            t.call("%%ddp cells", "the next cell after: " + code.replace("\n", "; "),
                   lambda: ip.run_cell_magic("ddp", "", "rank"), clear=CLEAR + (CellFailed,))
    with capture_output():
        ip.run_line_magic("ddp_stop", "")
        t.call("%%ddp cells", "a cell with no session", lambda: ip.run_cell_magic("ddp", "", "rank"),
               clear=CLEAR + (CellFailed,))


def idle_deadline(t: Tally, tmp: Path) -> None:
    from ddplab.launch import session as sessions

    old = sessions.IDLE_S
    sessions.IDLE_S = 5.0
    try:
        for at in (4.7, 4.95, 5.0, 5.2, 5.5):
            ddplab.run(Experiment(name="warmup", world_size=2, steps=1), tmp / f"idle-warm-{at}", progress=False,
                       warm=True)
            time.sleep(at)
            t.call("idle deadline", f"a job {at} s after the last",
                   lambda: ddplab.run(Experiment(name="late", world_size=2, steps=1), tmp / f"idle-{at}",
                                      progress=False, warm=True))
    finally:
        sessions.IDLE_S = old
        sessions.close_current()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cats = ["fuzz", "results", "files", "malicious", "cli", "faults", "cells", "idle",
            "owned", "guard", "deaths", "sessions", "gradients", "refusals"]   # the last six: misuse_round4.py
    ap.add_argument("--only", nargs="+", choices=cats, default=cats)
    ap.add_argument("--fuzz-examples", type=int, default=6000)
    ap.add_argument("--log", default=str(ROOT / "bench" / "misuse_probe.jsonl"))
    a = ap.parse_args()
    t = Tally()
    t0 = time.monotonic()
    os.environ[PROBE_MARK] = f"{os.getpid()}-{time.time_ns()}"
    before = _lab_processes()
    with tempfile.TemporaryDirectory(prefix="ddplab-probe-") as d:
        tmp = Path(d)
        os.environ.setdefault("DDPLAB_KEY_FILE", str(tmp / "key" / "checkpoint.key"))
        if "fuzz" in a.only:
            fuzz(t, a.fuzz_examples)
            print(f"fuzz done ({time.monotonic() - t0:.0f} s)", flush=True)
        runs = make_runs(tmp) if {"results", "files", "malicious"} & set(a.only) else {}
        steps = [("results", lambda: results_api(t, runs)), ("files", lambda: damaged_files(t, runs, tmp)),
                 ("malicious", lambda: malicious(t, runs, tmp)), ("cli", lambda: cli(t)),
                 ("faults", lambda: faults(t, tmp)), ("cells", lambda: cells(t)),
                 ("idle", lambda: idle_deadline(t, tmp))]
        import misuse_round4 as r4   # beside this file; it imports this one's helpers

        steps += [("owned", lambda: r4.owned_processes(t, tmp)), ("owned", lambda: r4.owned_stops(t, tmp)),
                  ("guard", lambda: r4.guard(t, tmp)), ("deaths", lambda: r4.deaths(t, tmp)),
                  ("sessions", lambda: r4.session_deaths(t, tmp)), ("gradients", lambda: r4.gradients(t, tmp)),
                  ("refusals", lambda: r4.refusals(t, tmp))]
        for name, step in steps:
            if name in a.only:
                try:
                    step()
                except Exception as e:  # noqa: BLE001 - the probe itself broke: say so, count it raw
                    t.add(name, "raw", "the probe step itself", f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
                print(f"{name} done ({time.monotonic() - t0:.0f} s)", flush=True)
    time.sleep(1)
    left = [p for p in _lab_processes() if p not in before]
    for p in left:
        t.add("processes", "left a process", p)
    total = {k: sum(v for o, v in c.items() if not o.startswith("(")) for k, c in t.counts.items()}
    for cat, c in t.counts.items():
        print(f"{cat:20s} {total[cat]:5d} cases: " + ", ".join(f"{o} {n}" for o, n in sorted(c.items())))
    bad = sum(c.get(o, 0) for c in t.counts.values() for o in ("raw", "code ran", "wrong", "unnamed",
                                                                 "left a process"))
    print(f"all: {sum(total.values())} cases in {time.monotonic() - t0:.0f} s; raw/code ran/wrong/unnamed: {bad}; "
          f"processes left: {len(left)}")
    for r in t.raw:
        print(r)
    with open(a.log, "a") as f:
        f.write(json.dumps({"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                            "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                                     text=True, cwd=ROOT).stdout.strip(),
                            "only": a.only, "counts": t.counts, "bad": bad, "left": len(left),
                            "raw": t.raw[:200]}) + "\n")
    return 1 if bad or left else 0


if __name__ == "__main__":
    sys.exit(main())
