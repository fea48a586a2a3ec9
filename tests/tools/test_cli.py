"""The command line: flags come from the spec, a model in the current directory
imports, and a factory that exits is an error, not a silent success."""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddplab import Experiment, cli
from ddplab.spec.experiment import BUILTIN_MODELS, PROBES
from ddplab.spec.fault import FAULT_KINDS

DDPLAB = shutil.which("ddplab") or str(Path(sys.executable).parent / "ddplab")


def test_every_field_the_command_line_can_set_has_a_flag():
    fields = {f.name for f in dataclasses.fields(Experiment)} - {"task", "fault", "straggler"}
    assert {field for field, _, _ in cli.RUN_FLAGS.values()} == fields
    assert {field for field, _, _ in cli.FAULT_FLAGS.values()} == {f.name for f in dataclasses.fields(cli.Fault)}
    assert {field for field, _, _ in cli.STRAGGLER_FLAGS.values()} == {f.name for f in dataclasses.fields(cli.Straggler)}


def test_every_field_is_documented_once_in_the_spec_and_the_help_is_that_text():
    from ddplab.spec.experiment import field_docs

    docs = field_docs()
    assert set(docs) == {f.name for f in dataclasses.fields(Experiment)}
    assert all(docs.values()) and not any("{" in d for d in docs.values())   # every {CHOICES} filled in
    assert all(help_text == docs[field] for field, _, help_text in cli.RUN_FLAGS.values())

    @dataclasses.dataclass
    class Half:
        documented: int = 1
        """said once"""
        silent: int = 2

    assert field_docs(Half) == {"documented": "said once"}


def test_help_lists_what_the_spec_accepts():
    flags = {**cli.RUN_FLAGS, **cli.FAULT_FLAGS}
    assert all(m in flags["--model"][2] for m in BUILTIN_MODELS)
    assert all(k in flags["--fault"][2] for k in FAULT_KINDS)
    assert all(p in flags["--probes"][2] for p in PROBES)


def test_flags_parse_into_the_experiment():
    parser_args = ["run", "--world-size", "2", "--local-batch", "4,8", "--probes", "gradients,bytes",
                   "--find-unused-parameters", "true", "--fault", "crash", "--fault-rank", "0", "--steps", "2"]
    exp = cli.experiment_from_args(cli.build_parser().parse_args(parser_args))
    assert exp.local_batch == (4, 8) and exp.probes == ("gradients", "bytes") and exp.find_unused_parameters
    assert exp.fault == cli.Fault("crash", rank=0, step=0)
    slow = cli.experiment_from_args(cli.build_parser().parse_args(["run", "--straggler", "data", "--straggler-ms", "5"]))
    assert slow.straggler == cli.Straggler(rank=1, where="data", ms=5.0)
    with pytest.raises(ValueError, match="straggler"):
        cli.experiment_from_args(cli.build_parser().parse_args(["run", "--straggler-ms", "5"]))


def test_a_factory_that_exits_is_refused_naming_the_model(tmp_path):
    out = subprocess.run([DDPLAB, "run", "--model", "sys:exit", "--out", str(tmp_path / "r")],
                         capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
    assert "Experiment.model: sys:exit called sys.exit(None)" in out.stderr


@pytest.mark.slow
def test_a_model_module_in_the_current_directory_imports_from_the_console_script(tmp_path):
    (tmp_path / "mymodels.py").write_text(
        "import torch.nn as nn\n"
        "def tiny(vocab_size, d_model):\n"
        "    return nn.Sequential(nn.Embedding(vocab_size, d_model), nn.Linear(d_model, vocab_size))\n")
    out = subprocess.run([DDPLAB, "run", "--model", "mymodels:tiny", "--world-size", "2", "--out", str(tmp_path / "r")],
                         capture_output=True, text=True, cwd=tmp_path, timeout=180)
    assert out.returncode == 0, out.stderr
    assert "global batch 16" in out.stdout


def test_ddplab_lab_opens_jupyterlab_on_the_notebooks(capsys):
    from ddplab import cli

    assert cli.main(["lab", "--print-command"]) == 0
    command = shlex.split(capsys.readouterr().out)
    assert command[1:3] == ["-m", "jupyterlab"] and command[3] == str(cli.notebooks_dir())
    assert (cli.notebooks_dir() / "00_launch_and_ranks.ipynb").exists()


def test_ddplab_lab_passes_jupyterlabs_own_arguments_on_in_order(capsys):
    """`--no-browser` or `--port=0` are JupyterLab's, not ddplab's: argparse alone refused them (exit 2)."""
    for given, passed in [(["--no-browser", "--port=0"], ["--no-browser", "--port=0"]),
                          (["--port", "8888", "--print-command"], ["--port", "8888"]),
                          (["--", "--no-browser", "--print-command"], ["--no-browser", "--print-command"]),
                          (["--ServerApp.root_dir=/tmp/my notebooks"], ["--ServerApp.root_dir=/tmp/my notebooks"])]:
        assert cli.main(["lab", "--print-command", *given]) == 0
        assert shlex.split(capsys.readouterr().out)[4:] == passed, given   # the printed line, run by a shell


def test_ddplab_lab_says_which_extra_brings_jupyterlab(monkeypatch, capsys):
    import importlib.util
    import tomllib

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "jupyterlab" else find_spec(name, *a))
    assert cli.main(["lab"]) == 1
    assert capsys.readouterr().err.strip().endswith('pip install -e ".[notebooks]"')
    project = tomllib.loads((Path(cli.__file__).parents[2] / "pyproject.toml").read_text())["project"]
    assert "jupyterlab" in project["optional-dependencies"]["notebooks"]   # the extra the message names


def logged_match(proc: subprocess.Popen, pattern: str, deadline: float) -> str:
    """The first match of `pattern` in `proc`'s stderr, read on a thread so that a process that logs
    nothing fails at `deadline` (a monotonic time), not at pytest's timeout. The thread reads on
    afterwards, so a full pipe never blocks the process."""
    import queue
    import threading

    lines: queue.Queue = queue.Queue()

    def read():
        for line in proc.stderr:
            lines.put(line)
        lines.put(None)   # stderr closed: the process ended

    threading.Thread(target=read, daemon=True).start()
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            pytest.fail(f"nothing matching {pattern!r} logged by the deadline")
        if line is None:
            pytest.fail(f"exited with {proc.wait()} before logging {pattern!r}")
        if m := re.search(pattern, line):
            return m.group(0)


def test_a_silent_process_fails_at_the_deadline_not_at_pytests_timeout():
    silent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stderr=subprocess.PIPE, text=True)
    try:
        start = time.monotonic()
        with pytest.raises(pytest.fail.Exception, match="by the deadline"):
            logged_match(silent, "never", start + 1)
        assert time.monotonic() - start < 30
    finally:
        silent.kill()
        silent.wait()


@pytest.mark.slow
def test_ddplab_lab_no_browser_port_0_starts_a_server_that_answers(tmp_path):
    import json
    import signal
    import urllib.request

    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"), JUPYTER_CONFIG_DIR=str(tmp_path / "config"))
    root = ["--allow-root"] if os.geteuid() == 0 else []   # JupyterLab refuses root without it
    lab = subprocess.Popen([DDPLAB, "lab", "--no-browser", "--port=0", "--ServerApp.token=", *root], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        # JupyterLab logs where it listens once it serves (localhost may be ::1 first)
        url = logged_match(lab, r"http://127\.0\.0\.1:\d+/", deadline)
        assert int(url.rsplit(":", 1)[1].strip("/")) > 0   # port 0: the kernel chose a free port
        while True:   # the URL is logged as the server starts listening: ask until it answers
            try:
                with urllib.request.urlopen(url + "api", timeout=30) as answer:
                    assert "version" in json.loads(answer.read())
                break
            except urllib.error.URLError:
                assert lab.poll() is None and time.monotonic() < deadline, "JupyterLab never answered at " + url
                time.sleep(0.5)
    finally:
        os.killpg(lab.pid, signal.SIGTERM)
        try:
            lab.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(lab.pid, signal.SIGKILL)
            lab.wait()


@pytest.mark.slow
def test_a_run_whose_loss_goes_nan_exits_3_and_says_where(tmp_path, capsys):
    """A run at lr=1000 trains to NaN: the ranks ran as asked, so it is no RunFailed, but `ddplab run` must
    not report it as a success. The launch's last line says where the loss stopped being finite."""
    code = cli.main(["run", "--world-size", "2", "--lr", "1000", "--steps", "6", "--out", str(tmp_path / "nan")])
    out = capsys.readouterr()
    assert code == 3, out
    assert re.search(r"warning: experiment: the loss became (nan|inf) at step \d on rank\(s\) 0, 1: training diverged "
                     r"\(lr=1000; try a smaller one\)", out.out + out.err), out


@pytest.mark.slow
def test_ddplab_plan_prints_every_plan_with_its_sources_and_an_estimate(capsys):
    code = cli.main(["plan", "--world-sizes", "8,1024", "--strategies", "ddp,fsdp2", "--device-gib", "0.003"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert len(re.findall(r"^ +(8|1024) +(ddp|fsdp2) ", out.out, re.MULTILINE)) == 2 * 4, out.out   # plans, estimates
    assert "fits 0.003 GiB" in out.out and "FSDPMemTracker" in out.out and "ESTIMATE" in out.out
    assert out.err.count("planned ") == 4   # a line as each plan arrived


def test_ddplab_plan_refuses_bad_input_naming_the_field(capsys):
    assert cli.main(["plan", "--world-sizes", "0"]) == 2
    assert "PlanSpec.world_size" in capsys.readouterr().err
    assert cli.main(["plan", "--world-sizes", "eight"]) == 2
    assert "--world-sizes" in capsys.readouterr().err
