"""No process a run starts outlives its owner: a user's script's ranks and what
they start when `run_script`'s caller is killed, what `%%ddp` cells start at `%ddp_stop` or when the
kernel is killed, what a script or a model factory leaves running when it ends (stopped, and said),
and no `torchelastic_*` or run folder left in $TMPDIR (`launch/keeper.py`).

Each process a case starts carries a tag of the test in its command line, so counting them needs
nothing from the lab; a broken path leaves them sleeping for minutes, far past every bound here."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
import warnings

import psutil
import pytest

import ddplab
from ddplab.launch import keeper
from ddplab.processes import live_processes

SLEEPER = "import time, sys; time.sleep(300)"   # started with the test's tag as its argument
BOUND_S = 15.0   # a busy 2-core machine stops a tree in well under this; a broken path leaves it for 300 s


def tagged(tag: str) -> list[str]:
    """Command lines of live processes whose command line carries `tag` (none of the lab's own do)."""
    return [cmd for pid, cmd in live_processes((tag,)) if pid != os.getpid()]


def gone_within(tag: str, bound_s: float = BOUND_S) -> tuple[list[str], float]:
    """(what still carries `tag` after `bound_s` or as soon as nothing does, the seconds that took)."""
    t0 = time.monotonic()
    while tagged(tag) and time.monotonic() - t0 < bound_s:
        time.sleep(0.1)
    return tagged(tag), time.monotonic() - t0


def wait_for(tag: str, count: int, bound_s: float = 120.0) -> None:
    deadline = time.monotonic() + bound_s
    while len(tagged(tag)) < count:
        assert time.monotonic() < deadline, f"only {tagged(tag)} started"
        time.sleep(0.2)


def spawns(tag: str, new_session: bool) -> str:
    """Python source that starts one sleeper carrying `tag` (in a session of its own, or not)."""
    return (f"__import__('subprocess').Popen([__import__('sys').executable, '-c', {SLEEPER!r}, {tag!r}], "
            f"start_new_session={new_session})")


# ---- the keeper alone: no torch, fast -------------------------------------------------------------------
def test_the_keeper_stops_and_names_what_a_command_that_ended_left_running(tmp_path):
    tag = f"kept-{uuid.uuid4().hex}"
    report = tmp_path / keeper.REPORT
    # a command whose child detaches twice (a new session, then its parent exits): only a subreaper keeps it
    child = f"import subprocess, sys; {spawns(tag, True)}; {spawns(tag, False)}"
    command = [sys.executable, "-c", f"import subprocess, sys; subprocess.run([sys.executable, '-c', {child!r}])"]
    done = subprocess.run([sys.executable, "-I", keeper.__file__, "--report", str(report), "--", *command],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert tagged(tag) == [], "the keeper exited with the command's children still running"
    named = keeper.left_running(report)
    assert len(named) == 2 and all(tag in c for c in named), named
    assert "2 process(es) it started still running; they were stopped" in done.stderr


def test_the_keeper_exits_with_its_commands_status_or_signal(tmp_path):
    for code, command in ((7, "import os; os._exit(7)"), (-signal.SIGKILL, "import os; os.kill(os.getpid(), 9)")):
        done = subprocess.run([sys.executable, "-I", keeper.__file__, "--", sys.executable, "-c", command], timeout=60)
        assert done.returncode == code


def test_a_factory_built_in_this_process_leaves_nothing_running():
    tag = f"preflight-{uuid.uuid4().hex}"
    with pytest.warns(UserWarning, match=r"started 2 process\(es\) that were still running .* they were stopped"):
        with keeper.children_stopped("a factory"):
            exec(f"import subprocess, sys; {spawns(tag, True)}; {spawns(tag, False)}")
    assert tagged(tag) == []


# ---- 1. run_script's caller killed ------------------------------------------------------------------------
CALLER = textwrap.dedent("""
    import sys, ddplab
    ddplab.run_script(sys.argv[1], sys.argv[2], timeout_s=120)   # the tag: on the ranks' command lines too
""")


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_killing_run_scripts_caller_stops_the_ranks_and_what_they_started(tmp_path, sig):
    tag = f"script-{uuid.uuid4().hex}"
    script = tmp_path / "fork_hang.py"
    script.write_text(f"import subprocess, sys, time\n{spawns(tag, True)}\ntime.sleep(300)  # {tag}\n")
    private = tmp_path / "tmp"
    private.mkdir()
    caller = subprocess.Popen([sys.executable, "-c", CALLER, str(script), tag], env={**os.environ, "TMPDIR": str(private)},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(tag, 7)   # the caller, the keeper, torchrun, 2 ranks, each with its child
        caller.send_signal(sig)
        caller.wait(timeout=30)
        left, took = gone_within(tag)
        assert left == [], f"{sig.name} of run_script's caller left {len(left)} process(es) after {took:.1f} s: {left}"
        t0 = time.monotonic()
        while list(private.iterdir()) and time.monotonic() - t0 < BOUND_S:
            time.sleep(0.1)
        assert list(private.iterdir()) == [], "the run's folders stayed in $TMPDIR"
    finally:
        caller.kill()
        caller.wait()


# ---- 3. a script that ends with a child still running; 4. its temporary folder --------------------------
@pytest.mark.slow
def test_a_script_that_ends_leaving_a_child_has_it_stopped_and_named(tmp_path):
    tag = f"leaves-{uuid.uuid4().hex}"
    script = tmp_path / "leaves_child.py"
    script.write_text(f"import os, subprocess, sys\n{spawns(tag, True)}\nprint('TMPDIR=' + os.environ['TMPDIR'])\n")
    with pytest.warns(UserWarning, match=r"leaves_child.py ended with 2 process\(es\) it started still running"):
        result = ddplab.run_script(script, world_size=2, timeout_s=120)
    assert result.returncode == 0, result.output
    assert tagged(tag) == [], "run_script returned with the script's children still running"
    assert len(result.stopped) == 2 and all(tag in c for c in result.stopped), result.stopped
    rank_tmp = {line.split("=", 1)[1] for text in result.ranks.values() for line in text.splitlines()
                if line.startswith("TMPDIR=")}
    assert len(rank_tmp) == 1 and "ddplab-run-" in next(iter(rank_tmp)), rank_tmp
    assert not os.path.exists(next(iter(rank_tmp))), "the ranks' temporary folder outlived the run"


# ---- 2. what %%ddp cells start ------------------------------------------------------------------------------
def _cells_spawn(tag: str) -> str:
    return f"import subprocess, sys\n{spawns(tag, False)}\n{spawns(tag, True)}\nrank"


@pytest.mark.slow
def test_ddp_stop_stops_what_the_cells_started(capsys):
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    tag = f"cell-{uuid.uuid4().hex}"
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "ddplab")
    with capture_output():
        ip.run_line_magic("ddp_start", "-n 2 --timeout 10")
        ip.run_cell_magic("ddp", "", _cells_spawn(tag))
    assert len(tagged(tag)) == 4   # plain and new-session children, on both ranks
    ip.run_line_magic("ddp_stop", "")
    said = capsys.readouterr().out
    assert tagged(tag) == [], "%ddp_stop returned with what the cells started still running"
    assert "stopped 2 ranks, and 4 process(es) the session's ranks started and left running" in said, said


KERNEL = textwrap.dedent("""
    import sys, time
    from IPython.core.interactiveshell import InteractiveShell
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "ddplab")
    ip.run_line_magic("ddp_start", "-n 2 --timeout 10")
    ip.run_cell_magic("ddp", "", sys.argv[1])
    time.sleep(300)
""")


@pytest.mark.slow
def test_killing_the_kernel_stops_what_the_cells_started():
    tag = f"kernel-{uuid.uuid4().hex}"
    kernel = subprocess.Popen([sys.executable, "-c", KERNEL, _cells_spawn(tag)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        wait_for(tag, 5)   # the kernel itself (the cell is its argument) and the 4 children
        kernel.kill()
        kernel.wait()
        left, took = gone_within(tag)
        assert left == [], f"a killed kernel left {len(left)} process(es) after {took:.1f} s: {left}"
    finally:
        kernel.kill()
        kernel.wait()


# ---- 3. a model factory whose forward starts a child; 4. no torchelastic_* folder -------------------------
_STARTED: list = []


def spawning_factory(vocab_size: int, d_model: int):
    """A model whose first forward in each process starts a child that never ends (the test's tag in
    $OWNED_TAG), as a factory that launches a helper server might."""
    import torch.nn as nn

    class Spawning(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(vocab_size, d_model)
            self.head = nn.Linear(d_model, vocab_size)

        def forward(self, idx):
            if not _STARTED:
                _STARTED.append(subprocess.Popen([sys.executable, "-c", SLEEPER, os.environ["OWNED_TAG"]],
                                                 start_new_session=True))
            return self.head(self.emb(idx))

    return Spawning()


@pytest.mark.slow
def test_a_factory_that_starts_a_child_leaves_nothing_running_and_no_temp_folder(tmp_path, monkeypatch):
    tag = f"factory-{uuid.uuid4().hex}"
    private = tmp_path / "tmp"
    private.mkdir()
    monkeypatch.setenv("OWNED_TAG", tag)
    monkeypatch.setenv("TMPDIR", str(private))   # torchrun's agent and the ranks inherit it
    monkeypatch.setattr(sys.modules[__name__], "_STARTED", [])
    exp = ddplab.Experiment(name="spawning", world_size=2, steps=1, local_batch=2, seq_len=8,
                            model=f"{__name__}:spawning_factory")
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        ddplab.run(exp, tmp_path / "run", progress=False, warm=False)
    assert tagged(tag) == [], "the launch returned with what the factory started still running"
    said = [str(w.message) for w in said]
    assert any("started 1 process(es) that were still running after it was built" in s for s in said), said
    assert any("spawning: a rank ended with 2 process(es) it started still running" in s for s in said), said
    left = [p.name for p in private.iterdir() if not p.name.startswith("torchinductor_")]
    assert left == [], f"the launch left {left} in $TMPDIR"


# ---- what stopping a run leaves, and what is not the run's ---------------------------
def test_a_child_that_ran_before_the_block_keeps_what_it_starts_during_it(tmp_path):
    """A pool's worker that existed before the factory ran, and that starts a process of its own while
    it runs, is not the factory's: neither is stopped."""
    tag = f"pool-{uuid.uuid4().hex}"
    go = tmp_path / "go"
    worker = subprocess.Popen([sys.executable, "-c", "import os, subprocess, sys, time\n"
                               f"while not os.path.exists({str(go)!r}): time.sleep(0.05)\n"
                               f"{spawns(tag, False)}\ntime.sleep(300)", tag])
    try:
        wait_for(tag, 1)
        with warnings.catch_warnings():
            warnings.simplefilter("error")   # a warning here would say it stopped them
            with keeper.children_stopped("a factory"):
                go.touch()
                wait_for(tag, 2, bound_s=60)
        assert len(tagged(tag)) == 2, tagged(tag)
    finally:
        for p in psutil.Process(worker.pid).children(recursive=True):
            p.kill()
        worker.kill()
        worker.wait()


def _keeper(tmp_path, command: str, *flags: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, keeper.__file__, "--owner", str(os.getpid()), *flags, "--",
                             sys.executable, "-c", command], stderr=subprocess.PIPE, text=True)


def test_a_signal_to_the_keeper_while_its_owner_lives_removes_none_of_the_owners_folders(tmp_path):
    tag = f"signalled-{uuid.uuid4().hex}"
    logs = tmp_path / "logs"
    logs.mkdir()
    proc = _keeper(tmp_path, f"import time; time.sleep(300)  # {tag}", "--orphaned-remove", str(logs))
    wait_for(tag, 2)   # the keeper (the command is its argument) and the command
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    assert tagged(tag) == []
    assert logs.is_dir(), "a SIGTERM to the keeper, its owner alive, deleted the owner's folder"


def test_a_keeper_whose_report_folder_is_gone_still_exits_with_its_commands_status(tmp_path):
    tag = f"noreport-{uuid.uuid4().hex}"
    report = tmp_path / "gone" / keeper.REPORT
    proc = _keeper(tmp_path, f"import os, subprocess, sys\n{spawns(tag, True)}\nos._exit(3)", "--report", str(report))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 3 and "Traceback" not in err, err
    assert tagged(tag) == []


def test_the_launchers_stop_signal_stops_the_run_names_what_it_started_and_removes_its_folder(tmp_path):
    tag = f"stopped-{uuid.uuid4().hex}"
    run_tmp, report = tmp_path / "ddplab-run-x", tmp_path / keeper.REPORT
    run_tmp.mkdir()
    rank = f"import subprocess, sys, time\n{spawns(tag, True)}\ntime.sleep(300)"   # a rank that starts a process
    torchrun = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {rank!r}, {tag!r}]); time.sleep(300)"
    proc = _keeper(tmp_path, torchrun, "--tmp", str(run_tmp), "--report", str(report))
    wait_for(tag, 4)   # the keeper and torchrun (the whole program is their argument), the rank and what it started
    proc.send_signal(keeper.STOP_SIGNAL)
    assert proc.wait(timeout=60) == -signal.SIGKILL   # as the launcher's SIGKILL always ended it
    assert tagged(tag) == []
    assert not run_tmp.exists(), "the keeper left its temporary folder"
    named = keeper.left_running(report)
    assert len(named) == 1 and SLEEPER in named[0], named   # what the rank started, not torchrun or the rank


def _tmp_left(private) -> list[str]:
    return [p.name for p in private.iterdir() if not p.name.startswith("torchinductor_")]


@pytest.mark.slow
def test_a_run_script_that_times_out_leaves_nothing_in_tmpdir(tmp_path, monkeypatch):
    tag = f"timeout-{uuid.uuid4().hex}"
    private = tmp_path / "tmp"
    private.mkdir()
    monkeypatch.setenv("TMPDIR", str(private))
    script = tmp_path / "hangs.py"
    script.write_text(f"import subprocess, sys, tempfile, time\ntempfile.mkstemp()\n{spawns(tag, True)}\n"
                      f"time.sleep(300)  # {tag}\n")
    with pytest.raises(TimeoutError):
        ddplab.run_script(script, world_size=1, timeout_s=25)
    left, took = gone_within(tag)
    assert left == [], f"{len(left)} process(es) left after {took:.1f} s: {left}"
    assert _tmp_left(private) == [], "a run stopped at its timeout left its folders in $TMPDIR"


@pytest.mark.slow
def test_a_cold_launch_the_watchdog_stops_leaves_nothing_in_tmpdir(tmp_path, monkeypatch):
    from ddplab.launch import watch
    from ddplab.spec import Fault

    private = tmp_path / "tmp"
    private.mkdir()
    monkeypatch.setenv("TMPDIR", str(private))
    monkeypatch.setattr(watch, "STALL_GRACE_S", 1.0)
    exp = ddplab.Experiment(name="stall", world_size=1, steps=2, fault=Fault("stall", step=1), timeout_s=2)
    with pytest.raises(ddplab.RunFailed, match="ddplab stopped the run"):
        ddplab.run(exp, tmp_path / "stall", progress=False, warm=False)
    assert _tmp_left(private) == [], "a launch the watchdog stopped left its folders in $TMPDIR"


_BUILT: list = []


def built_counted_spawning_factory(vocab_size: int, d_model: int):
    """`spawning_factory`, counted in `_BUILT` each time it is built, and starting a child at every forward."""
    model = spawning_factory(vocab_size, d_model)
    _BUILT.append(1)
    forward = model.forward

    def spawning_forward(idx):
        _STARTED.clear()
        return forward(idx)

    model.forward = spawning_forward
    return model


def test_the_audits_checks_build_the_factory_once_and_leave_nothing_running(monkeypatch):
    from ddplab.launch import preflight

    tag = f"audit-{uuid.uuid4().hex}"
    monkeypatch.setenv("OWNED_TAG", tag)
    monkeypatch.delenv("DDPLAB_SKIP_SIZE_CHECKS", raising=False)
    monkeypatch.setattr(preflight, "memory_available", lambda: (2 ** 30, "this machine has"))   # refused: no launch
    monkeypatch.setattr(sys.modules[__name__], "_BUILT", [])
    monkeypatch.setattr(sys.modules[__name__], "_STARTED", [])
    with pytest.warns(UserWarning, match=r"started \d+ process\(es\) that were still running"):
        with pytest.raises(ValueError, match="^local_batch: .* use --local-batch"):
            ddplab.audit_model(f"{__name__}:built_counted_spawning_factory", world_size=2, local_batch=100_000,
                               seq_len=1024, device="cpu")
    assert tagged(tag) == [], "the audit's checks left what the factory started running"
    assert len(_BUILT) == 1, f"the factory was built {len(_BUILT)} times before the launch"


def test_an_ended_ranks_inductor_compile_workers_are_stopped_without_a_word(tmp_path):
    tag = f"pool-{uuid.uuid4().hex}"
    report = tmp_path / keeper.REPORT
    sidecar = f"[sys.executable, '-c', {SLEEPER!r}, {tag!r}, '-m', 'torch._inductor.' + 'compile_worker']"
    command = (f"import subprocess, sys; subprocess.Popen({sidecar}, start_new_session=True); "
               f"{spawns(tag, True)}")   # a sidecar (by its command line), and a process that is no one's
    proc = _keeper(tmp_path, command, "--report", str(report))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and tagged(tag) == [], err
    named = keeper.left_running(report)
    assert len(named) == 1 and "compile_worker" not in named[0], named
