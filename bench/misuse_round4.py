"""bench/misuse_probe.py's fourth round (issue 51): processes a run starts and must not outlive their owner,
the guard's named stops, what a launch says when something dies or compiles, what DDP's bucket carries and a
model no gradient reaches, and the late refusals. Run through misuse_probe.py:

    python bench/misuse_probe.py --only owned guard deaths gradients refusals

Each function takes misuse_probe's Tally and a scratch folder and counts its cases as that file does.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import ddplab
from ddplab import Experiment, recipes
from ddplab.failures import RunFailed
from ddplab.verify import CheckFailed

from misuse_probe import CLEAR, ROOT, Tally, _cli_ok, _lab_processes, _Wrong  # noqa: F401 - Tally: the type taken


# ---- processes a run starts: none outlives its owner (issue 51, items 1-4) ------------------------------
def _tagged(tag: str) -> list[str]:
    from ddplab.processes import live_processes

    return [f"{pid}: {cmd[:100]}" for pid, cmd in live_processes((tag,)) if pid != os.getpid()]


def owned_processes(t: Tally, tmp: Path) -> None:
    """Each case tags what it starts (the tag on its command line); 1.5 s after the owner dies or the
    call returns, nothing tagged may live ("left a process"), and $TMPDIR (a private one) stays empty."""
    import uuid

    sleeper = "import time, sys; time.sleep(300)"
    spawn = lambda tag, new: (f"__import__('subprocess').Popen([__import__('sys').executable, '-c', {sleeper!r}, "  # noqa: E731
                              f"{tag!r}], start_new_session={new})")
    private = tmp / "owned-tmp"
    private.mkdir(exist_ok=True)
    env = {**os.environ, "TMPDIR": str(private)}

    def judge(case: str, fn) -> None:
        tag = f"owned-{uuid.uuid4().hex}"
        try:
            fn(tag)
        except Exception as e:  # noqa: BLE001
            t.add("owned processes", "raw", case, f"{type(e).__name__}: {str(e)[:300]}")
            return
        time.sleep(1.5)
        left = _tagged(tag)
        t.add("owned processes", "left a process" if left else "clear", case, "; ".join(left))

    def killed_caller(sig):
        def fn(tag):
            script = tmp / f"fork_hang_{tag}.py"
            script.write_text(f"import time\n{spawn(tag, True)}\ntime.sleep(300)\n")
            p = subprocess.Popen([sys.executable, "-c", "import sys, ddplab; ddplab.run_script(sys.argv[1], sys.argv[2], "
                                  "timeout_s=120)", str(script), tag], env=env, cwd=ROOT,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 120
            while len(_tagged(tag)) < 7 and time.monotonic() < deadline:   # caller, keeper, torchrun, 2 ranks, 2 children
                time.sleep(0.2)
            p.send_signal(sig)
            p.wait(timeout=30)
        return fn

    for sig in (signal.SIGKILL, signal.SIGTERM):
        judge(f"run_script's caller killed by {sig.name}", killed_caller(sig))

    def script_leaves_a_child(tag):
        script = tmp / f"leaves_{tag}.py"
        script.write_text(f"{spawn(tag, True)}\n")
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            r = ddplab.run_script(script, world_size=2, timeout_s=120)
        if len(r.stopped) != 2:
            raise _Wrong(f"ScriptRun.stopped names {len(r.stopped)} processes, not the 2 left running")
    judge("a script that ends with a child running", script_leaves_a_child)

    cell = lambda tag: f"import subprocess, sys\n{spawn(tag, False)}\n{spawn(tag, True)}\nrank"  # noqa: E731

    def ddp_stop(tag):
        from IPython.core.interactiveshell import InteractiveShell
        from IPython.utils.capture import capture_output

        ip = InteractiveShell.instance()
        ip.run_line_magic("load_ext", "ddplab")
        with capture_output():
            ip.run_line_magic("ddp_start", "-n 2 --timeout 10")
            ip.run_cell_magic("ddp", "", cell(tag))
            ip.run_line_magic("ddp_stop", "")
    judge("%ddp_stop after cells that started processes", ddp_stop)

    def killed_kernel(tag):
        code = ("import sys, time\nfrom IPython.core.interactiveshell import InteractiveShell\n"
                "ip = InteractiveShell.instance(); ip.run_line_magic('load_ext', 'ddplab')\n"
                "ip.run_line_magic('ddp_start', '-n 2 --timeout 10'); ip.run_cell_magic('ddp', '', sys.argv[1])\n"
                "time.sleep(300)")
        p = subprocess.Popen([sys.executable, "-c", code, cell(tag)], env=env, cwd=ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while len(_tagged(tag)) < 5 and time.monotonic() < deadline:   # the kernel and 4 children
            time.sleep(0.2)
        p.kill()
        p.wait()
    judge("a kernel killed after cells that started processes", killed_kernel)

    def factory(tag):   # tests/launch/test_owned_processes.py's factory: its forward starts a child, once a process
        os.environ["OWNED_TAG"] = tag
        old_tmp = os.environ.get("TMPDIR")
        os.environ["TMPDIR"] = str(private)
        try:
            with warnings.catch_warnings(record=True):
                warnings.simplefilter("always")
                ddplab.run(Experiment(name="spawning", world_size=2, steps=1, local_batch=2, seq_len=8,
                                      model="tests.launch.test_owned_processes:spawning_factory"),
                           tmp / f"owned-{tag}", progress=False, warm=False)
        finally:
            os.environ.pop("OWNED_TAG")
            os.environ.pop("TMPDIR") if old_tmp is None else os.environ.__setitem__("TMPDIR", old_tmp)
    judge("a factory whose forward starts a child (preflight and ranks)", factory)

    left = [p.name for p in private.iterdir() if not p.name.startswith("torchinductor_")]
    t.add("owned processes", "left a process" if left else "clear", "folders left in $TMPDIR", ", ".join(left))

# ---- ddplab.guard in a plain DDP script (issue 51, items 5 and 6) ----------------------------------------
def guard(t: Tally, tmp: Path) -> None:
    """Issue 51's items 5 and 6 in tests/guard/faulty_loop.py on 2 ranks: rank 1 stops in step 5 (before its
    forward, its backward or its optimizer step; raise and warn) and must be named, never left to gloo's raw
    error or to a wait as long as its sleep; a parameter registered after DDP wrapped the model must be
    blamed on that. Each case then counts the script's processes still alive 1.5 s after it returned."""
    import psutil

    script = ROOT / "tests" / "guard" / "faulty_loop.py"
    named = {"forward": "rank 1 stopped stepping: rank 1 has not begun step 5",
             "backward": "rank 1 stopped stepping: rank 1 is in step 5, before its backward",
             "step": "rank 1 did not reach the guard's check within 5 s"}

    def stops(at: str, on_problem: str) -> None:
        sleep = "600" if on_problem == "raise" else "12"   # raise: a wait as long as the sleep meets timeout_s
        done = ddplab.run_script(script, "stops", "--at", at, "--sleep", sleep, "--timeout", "5",
                                 "--on-problem", on_problem, world_size=2, timeout_s=200)
        said = done.ranks.get(0, "")
        if "Connection closed" in said or ("Traceback" in said and "GuardError" not in said):
            raise RuntimeError(f"rank 0 ended with a raw error: {said[-600:]}")
        if named[at] not in said:
            raise RuntimeError(f"rank 1 was not named (rc {done.returncode}): {said[-600:]}")
        if (done.returncode == 0) != (on_problem == "warn"):
            raise RuntimeError(f"on_problem={on_problem!r} but the script exited {done.returncode}")
        raise ValueError(next(x for x in said.splitlines() if "ddplab.guard, step" in x and named[at] in x)[:200])

    def late() -> None:
        done = ddplab.run_script(script, "late-parameter", world_size=2, timeout_s=200)
        errors = [x.get("error") or "" for x in done.json_lines()]
        if len(errors) != 2 or not all("late was registered on the model after DDP wrapped it" in e for e in errors):
            raise RuntimeError(f"not blamed on the late registration: {errors} {done.output[-600:]}")
        raise ValueError(errors[0].splitlines()[0][:200])

    cases = [(f"rank 1 stops before its {at}, on_problem={mode}", lambda at=at, mode=mode: stops(at, mode))
             for at in ("forward", "backward", "step") for mode in ("raise", "warn")]
    cases.append(("a parameter registered after DDP wrapped the model", late))
    for case, fn in cases:
        t.call("guard", case, fn)
        time.sleep(1.5)
        for p in psutil.process_iter(["pid", "cmdline"]):
            if str(script) in " ".join(p.info["cmdline"] or []):
                t.add("guard", "left a process", case, f"{p.pid}: {' '.join(p.info['cmdline'])[:120]}")

# ---- deaths and stalls a cold launch must name (issue 51, items 9 and 10) -------------------------
def deaths(t: Tally, tmp: Path) -> None:
    """torchrun's agent killed (SIGKILL, SIGTERM, SIGUSR2; mid-run and at start-up), a rank's os._exit(7), a
    rank SIGSTOPped while importing, a compile longer than the stall limit (must succeed) and past its own
    bound, a session killed or its directory deleted between cells. Each must say what happened: 'wrong' if
    the launcher's words are the old misdiagnosis, 'left a process' if anything of the launch lives on."""
    import threading

    import psutil

    from ddplab import processes
    from ddplab.launch import session as sessions
    from tests.support.dying_task import Dying

    # ranks started as new interpreters, so a rank can be stopped while it imports torch (a rank forked from
    # torchrun's agent has it imported: ddplab/rank/forked.py)
    os.environ["DDPLAB_RANK_START"] = "exec"

    def agent_of(where: Path):
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            for p in psutil.process_iter(["cmdline"]):
                cmd = " ".join(p.info["cmdline"] or [])
                if "ddplab.launch.loopback" in cmd and str(where) in cmd and processes.rank_of_name(p) is None:
                    return p   # torchrun's agent of this case
            time.sleep(0.02)
        raise RuntimeError(f"no torchrun agent under {where}")

    def reached(where: Path, phase: str, ranks=(0, 1)) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            logs = [list(where.glob(f".*.partial/rank{r}.progress")) for r in ranks]
            if all(any(f'"{phase}"' in f.read_text() for f in fs) for fs in logs):
                return
            time.sleep(0.05)
        raise RuntimeError(f"the ranks never reached {phase!r}")

    def stop_rank_1(where: Path) -> None:
        agent = agent_of(where)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for p in agent.children(recursive=True):
                try:
                    if p.environ().get("RANK") == "1" and not list(where.glob(".*.partial/rank1.progress")):
                        p.suspend()
                        return
                except psutil.Error:
                    pass
            time.sleep(0.005)

    def case(name: str, exp, expect: list[str], meanwhile=None, env: dict | None = None, succeeds=False,
             lines: list | None = None) -> None:
        out = tmp / "deaths" / name.replace(" ", "-")
        if meanwhile is not None:
            threading.Thread(target=lambda: _quiet(lambda: meanwhile(out.parent)), daemon=True).start()
        saved = {k: os.environ.get(k) for k in (env or {})}
        os.environ.update(env or {})
        try:
            ddplab.run(exp, out, progress=lines.append if lines is not None else False, warm=False)
            said = " ".join(lines or [])
            outcome = "clear" if succeeds and all(w in said for w in expect) else "wrong"
        except RunFailed as e:
            said = str(e.diagnosis.summary)
            outcome = "clear" if not succeeds and all(w in said for w in expect) else "wrong"
        except Exception as e:  # noqa: BLE001 - the probe counts exactly these
            said, outcome = f"{type(e).__name__}: {e}", "raw"
        finally:
            for k, v in saved.items():
                os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
        time.sleep(1.5)
        left = [p for p in _lab_processes() if str(out.parent) in p or str(out) in p]
        t.add("deaths", "left a process" if left else outcome, name, f"expected {expect}; said: {said[:400]} {left}")
        if out.parent.exists():
            shutil.rmtree(out.parent, ignore_errors=True)

    for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGUSR2):
        def kill_mid_run(where, sig=sig):
            agent = agent_of(where)
            reached(where, "dying wait")
            agent.send_signal(sig)
        said = {signal.SIGKILL: "was killed by SIGKILL", signal.SIGTERM: "received SIGTERM",
                signal.SIGUSR2: "was killed by SIGUSR2"}[sig]
        case(f"torchrun {sig.name} mid-run", Experiment(name="agent", world_size=2, task=Dying(wait_s=120),
                                                         timeout_s=200), [said, "mid-run"], kill_mid_run)
        case(f"torchrun {sig.name} at start-up", Experiment(name="agent", world_size=2, task=Dying(), timeout_s=30),
             ["torchrun", sig.name], lambda where, sig=sig: agent_of(where).send_signal(sig))
    case("rank os._exit(7)", Experiment(name="exit7", world_size=2, task=Dying(exit_rank=1, exit_code=7),
                                        timeout_s=30), ["Rank 1 exited with code 7"])
    case("rank SIGSTOP while importing", Experiment(name="stopped", world_size=2, task=Dying(), timeout_s=3),
         ["Rank 1 was stopped", "while still starting"], stop_rank_1)
    case("compile longer than the stall limit", Experiment(name="compiles", world_size=1, task=Dying(compile_s=16),
                                                           timeout_s=1), ["still compiling"], succeeds=True, lines=[])
    case("compile past its own bound", Experiment(name="compiles", world_size=1, task=Dying(compile_s=300),
                                                  timeout_s=1), ["still compiling (torch.compile)"],
         env={"DDPLAB_COMPILE_LIMIT_S": "3"})
    for how in ("a rank SIGKILLed", "its directory deleted"):
        s = ddplab.Session(world_size=2, runs_dir=tmp / "deaths-sessions")
        try:
            if how == "a rank SIGKILLed":
                os.kill(json.loads((s.dir / "rank1.progress").read_text().splitlines()[-1])["pid"], signal.SIGKILL)
                expect = "rank 1 was killed by SIGKILL"
            else:
                shutil.rmtree(s.dir)
                expect = f"its directory {s.dir} was deleted"
            s.proc.wait(timeout=60)
            why = sessions.last_end() or ""
            t.add("deaths", "clear" if expect in why else "wrong", f"session: {how} between cells",
                  f"expected {expect!r}; said: {why}")
        except Exception as e:  # noqa: BLE001 - the probe counts exactly these
            t.add("deaths", "raw", f"session: {how} between cells", f"{type(e).__name__}: {e}")
        finally:
            s.close()


def _quiet(fn) -> None:
    """Run `fn` (a probe's helper thread), dropping what it raises: the case it serves judges the outcome."""
    try:
        fn()
    except Exception:  # noqa: BLE001
        pass

# ---- gradients: what DDP's bucket carries, and a model no gradient reaches (issue 51, items 7 and 8) ---
DETACHED = "tests.support.gradient_models:detached_output"   # forward returns out.detach().requires_grad_()
NO_GRAPH = "import torch.nn as nn\nclass M(nn.Module):\n    def __init__(self, vocab_size, d_model):\n" \
           "        super().__init__()\n        self.emb = nn.Embedding(vocab_size, d_model)\n" \
           "        self.head = nn.Linear(d_model, vocab_size)\n    def forward(self, idx):\n" \
           "        return self.head(self.emb(idx)).detach()\ndef model(vocab_size, d_model):\n    return M(vocab_size, d_model)\n"


def _refused(fn, out: Path) -> None:
    """fn must refuse before launching: a ValueError and no run directory; a run that returns is wrong."""
    try:
        fn()
    except ValueError:
        if out.exists():
            raise _Wrong(f"refused, but only after {out} was made") from None
        raise
    raise _Wrong("a model that receives no gradient ran and reported success")


def _frozen_bytes_exact(tmp: Path) -> None:
    """The hook comparison on a model with a frozen matrix: DDP's bucket, the payload rule and every
    rank's bytes in every step must agree exactly (a CheckFailed here is the bug, not a clear refusal)."""
    from ddplab.predict import compression
    from ddplab.tables import compression as hooks

    exp = recipes.hook_comparison(model="tests.support.gradient_models:frozen_matrix", hooks=("allreduce", "fp16", "powersgd"),
                             name="probe-frozen", local=False, learn_steps=3, rounds=1, steps=1)
    run = ddplab.run(exp, tmp / "probe-frozen", progress=False, warm=False)
    rule = compression.payload_bytes("allreduce", hooks.bucket_shapes(run))
    carried = {a.bucket_bytes for r in run.ranks for a in r.result.arms}
    if carried != {rule}:
        raise _Wrong(f"DDP's bucket carried {sorted(carried)} B, the payload rule says {rule} B")
    table = hooks.bytes_table(run)
    try:
        hooks.verify_bytes(table)
    except CheckFailed as e:
        raise _Wrong(f"the task's own bytes check failed: {e}") from None
    if (table["worst_rel_error"] != 0).any():
        raise _Wrong(f"bytes off the rule: {table['worst_rel_error'].to_dict()}")


def _marked(marker: str) -> list[str]:
    """Processes that inherited DDPLAB_PROBE_CASE=marker, wherever they were reparented to (other work
    on the machine is not counted)."""
    import psutil

    out = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if p.pid != os.getpid() and p.environ().get("DDPLAB_PROBE_CASE") == marker:
                out.append(f"{p.pid}: {' '.join(p.info['cmdline'] or [])[:100]}")
        except (psutil.Error, OSError):
            pass
    return out


def _case(t: Tally, cat: str, case: str, fn) -> None:
    """t.call, then count the processes this case started that are alive 1.5 s after it returned."""
    marker = f"{os.getpid()}-{len(t.raw)}-{time.monotonic_ns()}"
    os.environ["DDPLAB_PROBE_CASE"] = marker
    try:
        t.call(cat, case, fn)
    finally:
        del os.environ["DDPLAB_PROBE_CASE"]
    time.sleep(1.5)
    for p in _marked(marker):
        t.add(cat, "left a process", case, p)


def gradients(t: Tally, tmp: Path) -> None:
    cat = "gradients"
    (tmp / "nograph.py").write_text(NO_GRAPH)
    sys.path.insert(0, str(tmp))
    cases = [
        ("ddplab run --model <detached output>", tmp / "g-cli",
         lambda out: _cli_ok(["run", "--model", DETACHED, "--world-size", "2", "--steps", "2", "--out", str(out)])),
        ("ddplab run --model <detached output> --find-unused-parameters true", tmp / "g-cli-unused",
         lambda out: _cli_ok(["run", "--model", DETACHED, "--world-size", "2", "--find-unused-parameters", "true",
                              "--out", str(out)])),
        ("ddplab audit --model <detached output>", tmp / "g-audit",
         lambda out: _cli_ok(["audit", "--model", DETACHED, "--world-size", "2", "--out", str(out)])),
        ("ddplab.run(<detached output>)", tmp / "g-api",
         lambda out: ddplab.run(Experiment(model=DETACHED, world_size=2, steps=2), out, progress=False, warm=False)),
        ("ddplab.run(<a loss with no graph>)", tmp / "g-nograph",
         lambda out: ddplab.run(Experiment(model="nograph:model", world_size=2, steps=2), out, progress=False,
                                warm=False)),
        ("ddplab.run(<detached output>, sync='none')", tmp / "g-nosync",
         lambda out: ddplab.run(Experiment(model=DETACHED, world_size=2, steps=2, sync="none"), out, progress=False,
                                warm=False)),
    ]
    try:
        for case, out, fn in cases:
            _case(t, cat, case, lambda: _refused(lambda: fn(out), out))
        _case(t, cat, "compression bytes on a model with a frozen matrix: exact", lambda: _frozen_bytes_exact(tmp))
    finally:
        sys.path.remove(str(tmp))

# ---- raw errors and late refusals (issue 51, item 11) ---------------------------------------------
def refusals(t: Tally, tmp: Path) -> None:
    """Each case of issue 51's item 11 fed as the probe found it; clear only if the ValueError (or the
    CLI's one line) names the field or file, "left a process" if a refusal left one of the lab's."""
    from types import SimpleNamespace as NS

    from ddplab.results import RankResult, Run
    from ddplab.spec.resume import Resume

    cat = "refusals"
    saving = dict(world_size=2, steps=4, local_batch=2, seq_len=8)

    def named(fn, *words):
        def check():
            try:
                fn()
            except CLEAR as e:
                if not all(w in str(e) for w in words):
                    raise RuntimeError(f"a refusal that does not name {words}: {e}") from None
                raise
        return check

    for where in ("a" * 300, "/" + "b/" * 3000, "x\x00y"):
        t.call(cat, f"Resume(resume_from={where[:12]!r}... ({len(where)} chars))",
               named(lambda: Experiment(task=Resume(resume_from=where), **saving), "task.resume_from"))
    key, old = tmp / "shared-key" / "checkpoint.key", os.environ.get("DDPLAB_KEY_FILE")
    key.parent.mkdir()
    key.write_text("ab" * 32)
    os.environ["DDPLAB_KEY_FILE"] = str(key)
    try:
        for mode in (0o644, 0o640, 0o604):
            key.chmod(mode)
            t.call(cat, f"a saving run's spec with a key of mode {mode:o}",
                   named(lambda: Experiment(task=Resume(save_at=2), **saving), "task.save_at", str(key)))
    finally:
        os.environ.pop("DDPLAB_KEY_FILE") if old is None else os.environ.__setitem__("DDPLAB_KEY_FILE", old)
    for path in (None, 3, b"runs/x", "", 1.5):
        t.call(cat, f"load_run({path!r})", named(lambda: ddplab.load_run(path), "path"))
    for name, text in (("not-json.txt", "this is not json"), ("cut.json", '{"world_size": 2,'),
                       ("binary.json", None), ("wrong-field.json", '{"lr": -1}')):
        f = tmp / name
        f.write_bytes(bytes(range(256))) if text is None else f.write_text(text)
        t.call(cat, f"ddplab run --spec {name}", named(lambda: _cli_ok(["run", "--spec", str(f)]), str(f)))
    # a real sweep and a real training run: the methods and tables that are not for them, a NaN loss
    sweep = ddplab.run(recipes.allreduce_sweep(2, max_bytes=8192, repeats=2), tmp / "refusals-sweep",
                       progress=False, warm=False)
    for method in ("global_loss", "step_ms"):
        t.call(cat, f"sweep run .{method}()", named(lambda: getattr(sweep, method)(), f"Run.{method}"))
    from ddplab.tables import buckets, compiled_ddp

    t.call(cat, "tables.buckets.judge_startup_term(a sweep up to 8 KiB)",
           named(lambda: buckets.judge_startup_term(sweep), "allreduce_run", "65536 B"))
    t.call(cat, "tables.buckets.judge_bandwidth_term(a sweep, 100 B)",
           named(lambda: buckets.judge_bandwidth_term(sweep, 100), "n_bytes"))
    # a compiled-ddp run that ran only the no_optimization mode (a stand-in: compiling costs a minute)
    arms = [NS(name=f"{k}:1/no_optimization", mode="no_optimization", compiled=k == "compiled", cap_mb=1.0, ready=[],
               backward_start_ns=0, split=[], ddp_buckets=[], graphs_compiled=1, recorded_graphs=1)
            for k in ("eager", "compiled")]
    modes = Run(tmp / "modes", recipes.compiled_ddp.eager_and_compiled(2).replace(name="modes"),
                [RankResult(NS(rank=0), NS(arms=arms, parameter_bytes={}))])
    for table, word in (("split", "run"), ("ready_order", "cap"), ("bursts", "cap")):
        t.call(cat, f"tables.compiled_ddp.{table}(a run without the ddp_optimizer arm)",
               named(lambda: getattr(compiled_ddp, table)(modes), f"{word}: 'modes'"))
    plain = ddplab.run(Experiment(name="refusals-nan", world_size=2, steps=2), tmp / "refusals-plain", progress=False,
                       warm=False)
    for field, value in (("loss", float("nan")), ("loss", float("inf")), ("loss_sum", float("nan")), ("loss", 1e308)):
        copy = Path(shutil.copytree(plain.path, tmp / f"nan-{field}-{value}"))
        d = json.loads((copy / "rank1.json").read_text())
        d["result"]["steps"][1][field] = value
        (copy / "rank1.json").write_text(json.dumps(d))
        t.call(cat, f"rank1.json step 1 {field}={value}", named(lambda: ddplab.load_run(copy), "Rank 1", "step 1"))
    t0 = time.monotonic()
    t.call(cat, "ddplab audit --local-batch 100000 --seq-len 1024 on a small user model",
           named(lambda: _cli_ok(["audit", "--model", "tests.support.user_models:counted", "--world-size", "2",
                                  "--local-batch", "100000", "--seq-len", "1024", "--out", str(tmp / "audit")]),
                 "--local-batch"))
    t.counts[cat]["(audit refusal, s)"] = round(time.monotonic() - t0, 1)
    import psutil

    for p in psutil.process_iter(["pid", "cmdline"]):   # any process of this audit (its --out), were it launched
        cmd = " ".join(p.info["cmdline"] or [])
        if str(tmp / "audit") in cmd:
            t.add(cat, "left a process", "the audit's refusal", f"{p.pid}: {cmd[:200]}")


# ---- the review's cases: a stopped run's temp folder, a signalled keeper, a pre-existing child's process ----
def owned_stops(t: Tally, tmp: Path) -> None:
    """A run_script stopped at its timeout leaves nothing in $TMPDIR and nothing running; a SIGTERM to the
    keeper while its owner lives keeps the owner's folders; children_stopped spares what a child that was
    already running starts during the block."""
    import uuid

    import psutil

    from ddplab.launch import keeper

    def tagged(tag):
        return [p for p in psutil.process_iter(["cmdline"])
                if tag in " ".join(p.info["cmdline"] or []) and p.pid != os.getpid()]

    private = tmp / "owned-stops-tmp"
    private.mkdir(exist_ok=True)
    tag = f"probe-{uuid.uuid4().hex}"
    script = tmp / "owned_hang.py"
    script.write_text(f"import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', 'import time; "
                      f"time.sleep(300)', {tag!r}], start_new_session=True)\ntime.sleep(300)\n")
    old = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(private)
    try:
        t.call("owned processes", "run_script past its timeout",
               lambda: ddplab.run_script(script, world_size=1, timeout_s=20), clear=(TimeoutError,))
    finally:
        os.environ.pop("TMPDIR") if old is None else os.environ.__setitem__("TMPDIR", old)
    time.sleep(1.5)
    left = [p.name for p in private.iterdir() if not p.name.startswith("torchinductor_")]
    t.add("owned processes", "left a process" if tagged(tag) else "clear", "run_script timeout: its processes")
    t.add("owned processes", "wrong" if left else "clear", "run_script timeout: $TMPDIR", str(left))

    logs = tmp / "owned-logs"
    logs.mkdir(exist_ok=True)
    tag = f"probe-{uuid.uuid4().hex}"
    k = subprocess.Popen([sys.executable, keeper.__file__, "--owner", str(os.getpid()), "--orphaned-remove", str(logs),
                          "--", sys.executable, "-c", f"import time; time.sleep(300)  # {tag}"])
    time.sleep(2)
    k.send_signal(signal.SIGTERM)
    k.wait(timeout=60)
    time.sleep(1.5)
    t.add("owned processes", "left a process" if tagged(tag) else "clear", "SIGTERM to the keeper: its processes")
    t.add("owned processes", "clear" if logs.is_dir() else "wrong",
          "SIGTERM to the keeper, owner alive: owner's folder kept")

    tag = f"probe-{uuid.uuid4().hex}"
    go = tmp / "owned-go"
    go.unlink(missing_ok=True)
    w = subprocess.Popen([sys.executable, "-c", f"import os, subprocess, sys, time\nwhile not os.path.exists({str(go)!r}): "
                          f"time.sleep(0.05)\nsubprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)', "
                          f"{tag!r}])\ntime.sleep(300)", tag])
    time.sleep(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with keeper.children_stopped("probe"):
            go.touch()
            time.sleep(3)
    t.add("owned processes", "clear" if len(tagged(tag)) == 2 else "wrong",
          "children_stopped spares a pre-existing child's new process")
    for p in psutil.Process(w.pid).children(recursive=True):
        p.kill()
    w.kill()
    w.wait()


# ---- a session's deaths: a warm job's torchrun killed, a rank killed while a session starts --------------
def session_deaths(t: Tally, tmp: Path) -> None:
    """Issue 51, items 9/10 after round 4: a warm job whose torchrun is killed, a rank killed while a session
    starts. Clear: RunFailed naming the signal; raw: anything else; left a process: one under tmp survives."""
    import threading

    import psutil

    from ddplab import processes
    from ddplab.launch import session as sessions
    from tests.support.dying_task import Dying

    os.environ["DDPLAB_RANK_START"] = "exec"   # rank 1 killed while it imports torch, as in deaths()

    def agent_of(where):
        for _ in range(6000):
            for p in psutil.process_iter(["cmdline"]):
                a = p.info["cmdline"] or []
                own = a[: a.index("--")] if "--" in a else a
                if "ddplab.launch.loopback" in own and str(where) in " ".join(a) and processes.rank_of_name(p) is None:
                    return p
            time.sleep(0.02)

    def left(where) -> list:
        return [p.pid for p in psutil.process_iter(["cmdline"]) if str(where) in " ".join(p.info["cmdline"] or [])]

    def case(name, start, act, said):
        where = tmp / name
        threading.Thread(target=act, args=(where,), daemon=True).start()
        try:
            start(where)
            t.add("session deaths", "raw", name, "no RunFailed")
        except RunFailed as e:
            ok = said in e.diagnosis.summary and "pid" not in e.diagnosis.summary
            t.add("session deaths", "clear" if ok else "raw", name, e.diagnosis.summary[:300])
        except Exception as e:  # noqa: BLE001
            t.add("session deaths", "raw", name, f"{type(e).__name__}: {e}")
        finally:
            cur = sessions.current()
            if cur is not None:
                cur.close()
        time.sleep(2)
        if left(where):
            t.add("session deaths", "left a process", name, str(left(where)))

    def warm_job(where):
        with ddplab.Session(world_size=2, runs_dir=where / "runs"):
            ddplab.run(Experiment(name="agent", world_size=2, task=Dying(wait_s=120), timeout_s=200),
                       where / "run", progress=False)

    def kill_agent_later(where):
        a = agent_of(where)
        time.sleep(25)   # the session has started and the job is in its wait
        a.kill()

    def kill_rank_1(where):
        a = agent_of(where)
        for _ in range(6000):
            for p in a.children(recursive=True):
                try:
                    if p.environ().get("RANK") == "1":
                        p.kill()
                        return
                except psutil.Error:
                    pass
            time.sleep(0.005)

    case("warm job, torchrun SIGKILLed", warm_job, kill_agent_later, "was killed by SIGKILL")
    case("session start, rank 1 SIGKILLed",
         lambda where: ddplab.Session(world_size=2, runs_dir=where / "runs"), kill_rank_1,
         "Rank 1 was killed by SIGKILL")
