"""The torch releases the lab is verified on, and each version-sensitive fact read from the running torch:
a release that changes one fails here, where a learner would otherwise read what an older torch did."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from ddplab import releases


@pytest.mark.parametrize("fact", releases.FACTS, ids=lambda f: f.name)
def test_each_fact_on_the_running_torch_is_what_it_was_on_its_release(fact):
    # a verified release: its own answer; a newer one: the newest verified release's, until it is verified
    base = releases.baseline(torch.__version__)
    assert fact.probe() == fact.expected[base], (
        f"torch {torch.__version__}: {fact.says}: {fact.probe()!r}, but {fact.expected[base]!r} on {base}; "
        f"update the lessons that rest on it, then releases.FACTS")


def test_every_fact_has_an_answer_for_every_verified_release():
    for fact in releases.FACTS:
        assert set(fact.expected) == set(releases.VERIFIED), fact.name


def test_the_verified_releases_are_what_the_project_declares_and_ci_installs():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    assert f'"torch>={releases.OLDEST}"' in (root / "pyproject.toml").read_text()
    ci = (root / ".ci" / "run").read_text()
    assert f"torch=={releases.OLDEST}" in ci
    readme = (root / "README.md").read_text()
    assert all(f"| {v} |" in readme for v in releases.VERIFIED), "the README's versions table"


@pytest.mark.parametrize("version, parsed", [("2.14.1+cu130", (2, 14, 1)), ("2.13.0+cpu", (2, 13, 0)),
                                             ("2.15.0a0+git1234", (2, 15, 0)), ("2.4", (2, 4, 0))])
def test_a_release_is_read_without_its_build_labels(version, parsed):
    assert releases.release(version) == parsed


@pytest.mark.parametrize("found, base", [("2.13.0+cpu", "2.13.0"), ("2.14.1", "2.14.1"), ("2.14.0", "2.13.0"),
                                         ("2.16.0", "2.14.1"), ("2.4.1", "2.13.0")])
def test_an_unverified_release_is_compared_with_the_newest_verified_one_below_it(found, base):
    assert releases.baseline(found) == base


def test_an_older_torch_is_refused_at_import_in_plain_words():
    with pytest.raises(ImportError, match=r"ddplab needs torch >= 2\.13\.0; this environment has torch 2\.4\.1"):
        releases.require_supported("2.4.1")
    with pytest.raises(ImportError, match="not installed"):
        releases.require_supported(None)
    releases.require_supported(releases.OLDEST)
    releases.require_supported("2.99.0")   # newer: runs, and `ddplab doctor` says what differs


def test_import_ddplab_with_an_older_torch_says_so_before_anything_else(tmp_path):
    # a torch package that says it is 2.4.1, found first on the path (never imported: it would say so)
    package = tmp_path / "torch"
    package.mkdir()
    (package / "__init__.py").write_text("raise SystemExit('torch was imported')\n")
    (package / "version.py").write_text("__version__ = '2.4.1'\n")
    out = subprocess.run([sys.executable, "-c", "import ddplab"], capture_output=True, text=True,
                         env={"PYTHONPATH": str(tmp_path), "PATH": ""})
    assert out.returncode == 1 and "ImportError: ddplab needs torch >= 2.13.0; this environment has torch 2.4.1" \
        in out.stderr, out.stderr


def test_a_probe_that_fails_is_said_not_raised(monkeypatch):
    def gone():
        raise AttributeError("module 'torch.distributed' has no attribute '_hash_ranks_to_str'")

    broken = [releases.Fact(f.name, f.says, gone if f.name == "local_group_name_counts" else f.probe, f.expected)
              for f in releases.FACTS]
    monkeypatch.setattr(releases, "FACTS", tuple(broken))
    said = releases.tell("local_group_name_counts")
    assert said.endswith("could not ask (AttributeError: module 'torch.distributed' has no attribute "
                         "'_hash_ranks_to_str')")
    assert any(line.startswith("  DIFFERS") and "could not ask" in line for line in releases.report(torch.__version__))
    with pytest.raises(ValueError, match="no fact named 'local_group_name_count'"):
        releases.fact("local_group_name_count")


def test_doctors_report_names_the_release_and_what_differs_from_a_verified_one(monkeypatch):
    here = releases.report(torch.__version__)[0]
    assert here.startswith(f"torch {torch.__version__}: ")
    # a made-up newer release whose analyzer went back to eval: the difference is named
    flipped = [releases.Fact(f.name, f.says, lambda f=f: not f.expected["2.14.1"] if f.name ==
                             "analyzer_evaluates_rank_lists" else f.expected["2.14.1"], f.expected)
               for f in releases.FACTS]
    monkeypatch.setattr(releases, "FACTS", tuple(flipped))
    lines = releases.report("2.99.0")
    assert lines[0] == "torch 2.99.0: not verified (CI checks 2.13.0, 2.14.1); compared with 2.14.1"
    assert [line for line in lines if "DIFFERS" in line] == [
        "  DIFFERS from 2.14.1: torch's flight-recorder analyzer runs a dump's rank list as Python (eval): "
        "True here, False on 2.14.1"]


_DETAIL_DDP = """
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
DDP(torch.nn.Linear(4, 4))(torch.randn(2, 4)).sum().backward()
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_ddps_constructor_still_crashes_on_a_gloo_group_checked_at_detail(tmp_path):
    # why ddplab refuses distributed_debug="detail" with DDP (spec/validate.py, notebook 08): if a release
    # fixes the crash, this fails, and the refusal can go
    import os

    import psutil

    script = tmp_path / "detail_ddp.py"
    script.write_text(_DETAIL_DDP)
    env = {**os.environ, "TORCH_DISTRIBUTED_DEBUG": "DETAIL", "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                             str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        _, err = proc.communicate(timeout=120)
    finally:   # torchrun starts each rank in a session of its own: stop whatever still runs the script
        for p in psutil.process_iter(["cmdline"]):
            if str(script) in " ".join(p.info["cmdline"] or []):
                p.kill()
        proc.kill()
    assert proc.returncode != 0 and "SIGSEGV" in err, err[-2000:]


def test_a_notebook_tells_the_running_torchs_answer_in_a_plain_sentence():
    said = releases.tell("analyzer_evaluates_rank_lists")
    assert said.startswith(f"torch {torch.__version__}: its flight-recorder analyzer ")
    assert ("(eval)" in said) == releases.fact("analyzer_evaluates_rank_lists")
    assert releases.tell("ddp_bucket_caps_mib") == \
        f"torch {torch.__version__}: DDP's default bucket caps in MiB (first bucket, the others): (1.0, 25.0)"
