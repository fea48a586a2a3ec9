"""`ddplab audit` estimates a user's model's memory before it launches (model state,
and the activations of one forward and loss, measured per example) and refuses a local batch that cannot
fit, naming --local-batch and the largest that does. Nothing launches: each case ends in the refusal, or
in the check passing."""

from __future__ import annotations

import re

import pytest

from ddplab import cli
from ddplab.launch import preflight
from ddplab.tools import audit
from ddplab.tools.factory import checked, experiment

SMALL = "tests.support.user_models:counted"
GIB = 2 ** 30


@pytest.fixture
def four_gib(monkeypatch):
    """This machine with 4 GiB available, whatever it has now (the arithmetic is then exact)."""
    monkeypatch.delenv("DDPLAB_SKIP_SIZE_CHECKS", raising=False)
    monkeypatch.setattr(preflight, "memory_available", lambda: (4 * GIB, "this machine has"))


def _exp(local_batch, seq_len=1024):
    return experiment(SMALL, "audit", {"seq_len": seq_len}, world_size=2, optimizer="sgd", local_batch=local_batch,
                      steps=audit.STEPS, probes=audit.PROBES, device="cpu")


def test_the_largest_local_batch_it_names_fits_and_one_more_does_not(four_gib):
    exp = _exp(100_000)
    counted = checked(exp)
    with pytest.raises(ValueError, match=r"^local_batch: 2 ranks of tests\.support\.user_models:counted at a local "
                                         r"batch of 100000 would need about \d+\.\d GiB .* and this machine has 4\.0 "
                                         r"GiB available: use --local-batch \d+ or less") as refused:
        audit.check_memory(exp, counted)
    fits = int(re.search(r"--local-batch (\d+) or less", str(refused.value)).group(1))
    assert 0 < fits < 100_000
    audit.check_memory(exp.replace(local_batch=fits), counted)
    with pytest.raises(ValueError, match=rf"use --local-batch {fits} or less"):
        audit.check_memory(exp.replace(local_batch=fits + 1), counted)


def test_the_loss_counts_among_the_activations(four_gib):
    """A small model with a wide head: cross-entropy's log-softmax (the logits' size) is as much as the
    model saves, and the launch counted only the model before (half of what a rank held, measured)."""
    exp = _exp(4, seq_len=16)
    logits_per_example = exp.seq_len * exp.vocab_size * 4
    assert preflight.measured_activations(exp) >= 2 * logits_per_example


def test_the_audit_refuses_before_anything_launches(four_gib, tmp_path, capsys):
    code = cli.main(["audit", "--model", SMALL, "--world-size", "2", "--local-batch", "100000", "--seq-len", "1024",
                     "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and re.search(r"^ddplab audit: local_batch: .* use --local-batch \d+ or less", err), err
    assert not (tmp_path / "out").exists()


def test_nothing_is_checked_when_size_checks_are_lifted(four_gib, monkeypatch):
    monkeypatch.setenv("DDPLAB_SKIP_SIZE_CHECKS", "1")
    exp = _exp(100_000)
    audit.check_memory(exp, checked(exp))
