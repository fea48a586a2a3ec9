"""A practitioner's own model: the factory contract (spec/model.py) with Hugging Face,
torchvision and plain factories, the checks that refuse a wrong factory before anything starts, and
`ddplab audit` / `ddplab tune-buckets` end to end, their numbers against independent counts."""

from __future__ import annotations

import json
import os
import re

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

import ddplab
from ddplab import Experiment, ModelWithData, cli, tables
from ddplab.launch.preflight import check_user_model
from ddplab.predict import buckets as simulator
from ddplab.rank import models
from ddplab.rank.reference import global_batch
from ddplab.tables import bucket_sweep
from ddplab.tables import buckets as bucket_views
from ddplab.tools import bucket_tuning, factory
from ddplab.units import MIB

HF = "ddplab.examples.hf_gpt2:gpt2"
SMALL = dict(vocab_size=512, d_model=64, n_layers=2, n_heads=4, seq_len=32)


def transformers_or_skip():
    return pytest.importorskip("transformers", reason="Hugging Face transformers is not installed")


# ---- wrong factories, refused before any launch, with what to fix --------------------------------
class _Flat(nn.Module):
    def __init__(self, vocab_size=64):
        super().__init__()
        self.emb, self.head = nn.Embedding(vocab_size, 8), nn.Linear(8, vocab_size)

    def forward(self, idx):
        return self.head(self.emb(idx)).mean(dim=1)   # (batch, vocab): one position, not one per token


def raises(vocab_size):
    raise RuntimeError("config has no attribute n_embd")


def wrong_shape(vocab_size):
    return _Flat(vocab_size)


def not_a_module():
    return {"model": "a dict"}


def labels_out_of_range():
    def batch(ids, seed):
        return torch.randn(len(ids), 4), torch.full((len(ids),), 7)   # 7 classes? the model has 3
    return ModelWithData(nn.Linear(4, 3), batch)


def images_without_targets():
    return ModelWithData(nn.Linear(4, 3), lambda ids, seed: torch.randn(len(ids), 4))


class _Argmax(nn.Module):
    def __init__(self, vocab_size=64):
        super().__init__()
        self.emb = nn.Embedding(vocab_size, vocab_size)

    def forward(self, idx):
        logits = self.emb(idx)
        return torch.zeros_like(logits, dtype=torch.long).scatter(-1, logits.argmax(-1, keepdim=True), 1)


def integer_logits(vocab_size):
    return _Argmax(vocab_size)


def all_frozen(vocab_size):
    return nn.Embedding(vocab_size, vocab_size).requires_grad_(False)


def exits(vocab_size):
    os._exit(0)


def sys_exits(vocab_size):
    raise SystemExit(3)


def nan_logits(vocab_size):
    emb = nn.Embedding(vocab_size, vocab_size)
    with torch.no_grad():
        emb.weight.fill_(float("nan"))
    return emb


@pytest.mark.parametrize("name, match", [
    ("raises", r"tests.tools.test_own_model:raises raised RuntimeError: config has no attribute n_embd"),
    ("integer_logits", r"returned torch.int64 logits; cross-entropy needs floating-point logits"),
    ("all_frozen", r"has no trainable parameter .*DDP would have nothing to synchronize"),
    ("nan_logits", r"returned logits that are NaN or infinite on two examples before any training"),
    ("exits", r"tried to end the process \(os._exit\(0\)\) while it was built"),
    ("sys_exits", r"sys_exits called sys.exit\(3\) instead of returning a model"),
    ("wrong_shape", r"must map token ids .* = \(2, 16, 64\); it returned \(2, 64\)"),
    ("not_a_module", r"returned dict, not an nn.Module"),
    ("labels_out_of_range", r"targets must be class ids in 0..2 .* gave 7..7"),
    ("images_without_targets", r"must return \(inputs, targets\), two tensors; it returned Tensor"),
    ("with_unused", r"leaves 2 trainable parameter\(s\) without a gradient .*: unused.weight, unused.bias"),
])
def test_a_wrong_factory_is_refused_with_what_to_fix(name, match):
    module = "tests.support.user_models" if name == "with_unused" else "tests.tools.test_own_model"
    with pytest.raises(ValueError, match=match):
        check_user_model(Experiment(model=f"{module}:{name}", world_size=2), gradients=True)


def test_the_unused_parameter_check_can_pass_and_the_token_check_sees_a_good_factory():
    model = check_user_model(Experiment(model="tests.support.user_models:with_frozen", world_size=2), gradients=True)
    assert not model.emb.weight.requires_grad   # frozen is fine: DDP skips it


@pytest.mark.parametrize("command", ["audit", "tune-buckets"])
def test_the_commands_refuse_a_wrong_factory_before_launching_anything(command, tmp_path, capsys):
    code = cli.main([command, "--model", "tests.tools.test_own_model:wrong_shape", "--world-size", "2", "--out",
                     str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and f"ddplab {command}: Experiment.model: tests.tools.test_own_model:wrong_shape must map" in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv, says", [
    (["audit", "--model", HF, "--world-size", "1"], r"world_size: the audit compares .* at least 2 ranks \(got 1\)"),
    (["audit", "--model", HF, "--json", "/"], r"--json /: is a directory; give a file name"),
    (["tune-buckets", "--model", HF, "--caps", "inf"], r"every cap is a finite number of MiB above 0"),
    (["tune-buckets", "--model", HF, "--caps", "1,1e400"], r"every cap is a finite number of MiB above 0"),
    (["audit", "--model", HF, "--compile-mode", "no_optimization"], r"--compile-mode no_optimization needs --compile"),
    (["audit", "--model", HF, "--compile", "tvm"], r"argument --compile: invalid choice: 'tvm'"),
    (["tune-buckets", "--model", HF, "--compile", "--compile-mode", "fast"], r"--compile-mode: invalid choice: 'fast'"),
    (["audit", "--model", HF, "--world-size", "2", "--compile", "--bucket-cap-mb", "0.5"],
     r"bucket_cap_mb: under --compile at least 1 MiB, or the default: DDPOptimizer asserts"),
    (["run", "--spec", "/nonexistent/spec.json"], r"ddplab run: spec: cannot read /nonexistent/spec.json"),
    (["run", "--lr", "1e308"], r"ddplab run: Experiment.lr: must be a positive number up to 1000"),
    (["run", "--import", "no_such_module_here", "--spec", "-"], r"--import no_such_module_here: cannot import it"),
])
def test_bad_command_line_input_is_refused_before_any_launch(argv, says, tmp_path, capsys):
    """Each was a raw error (after the launch, for some) in a probe of misuse; now exit code 2 and one line."""
    try:
        code = cli.main([*argv, "--out", str(tmp_path / "out")])
    except SystemExit as e:   # argparse refuses a bad flag value itself
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and re.search(says, err), err
    assert not (tmp_path / "out").exists()


def test_a_factory_defined_in_main_or_set_by_the_tool_is_a_value_error():
    def local():
        return nn.Linear(2, 2)
    local.__module__ = "__main__"
    with pytest.raises(ValueError, match="put it in a .py file"):
        factory.factory_path(local)
    assert factory.factory_path(wrong_shape) == "tests.tools.test_own_model:wrong_shape"
    with pytest.raises(ValueError, match="^sync: the tool sets it"):
        factory.experiment(HF, "audit", {"sync": "none"})
    with pytest.raises(ValueError, match="Experiment.world_size"):
        factory.experiment(HF, "audit", {}, world_size=0)


# ---- the three kinds of factory ------------------------------------------------------------------
def test_the_hugging_face_factory_gives_logits_and_the_same_count_as_hugging_face():
    transformers_or_skip()
    exp = Experiment(model=HF, world_size=2, **SMALL)
    built = models.build_with_data(exp)
    assert isinstance(built.module, __import__("transformers").PreTrainedModel) and not built.own_data
    x, _ = built.batch([0, 1], exp.seq_len)
    assert built.module(x).shape == (2, exp.seq_len, exp.vocab_size)   # .logits, taken by the lab
    counted = factory.checked(exp)
    assert counted.parameters == built.module.num_parameters() == models.parameter_count(built.module)


def test_the_torchvision_factory_brings_its_images():
    try:
        import torchvision  # noqa: F401
    except Exception as e:   # missing, or built for another torch (its C++ ops fail to register)
        pytest.skip(f"torchvision is not usable here: {type(e).__name__}: {e}")
    built = models.build_with_data(Experiment(model="ddplab.examples.vision:resnet18", world_size=2))
    x, y = built.batch([0, 1], 0)
    assert built.own_data and x.shape == (2, 3, 32, 32) and built.module(x).shape == (2, 10)


def test_a_model_with_its_own_data_feeds_the_ranks_and_the_reference_the_same_examples():
    exp = Experiment(model="ddplab.examples.vision:small_cnn", world_size=2, local_batch=(3, 2), d_model=8)
    built = models.build_with_data(exp)
    parts = global_batch(exp, built.batch, step=0)
    assert [tuple(x.shape) for x, _ in parts] == [(3, 3, 32, 32), (2, 3, 32, 32)]
    again = models.build_with_data(exp).batch([3, 4], 0)   # rank 1's ids, rebuilt in another "process"
    assert torch.equal(again[0], parts[1][0]) and torch.equal(again[1], parts[1][1])
    with pytest.raises(ValueError, match="returns a ModelWithData .* feeds token ids"):
        models.build(exp)


# ---- tune-buckets' choice of plans (pure) --------------------------------------------------------
def _inputs(sizes_kib, ms_each=2.0):
    grads = [simulator.Grad(f"p{i}", int(k * 1024), (i + 1) * ms_each) for i, k in enumerate(sizes_kib)]
    return bucket_sweep.Inputs(grads, backward_ms=ms_each * len(grads), forward_ms=5.0, optimizer_ms=1.0)


def test_candidate_caps_giving_the_same_buckets_count_once_and_the_default_and_a_split_are_measured():
    from ddplab.predict.comm import AlphaBeta

    ins = _inputs([512] * 8)   # 8 tensors of 0.5 MiB
    cost = simulator.Cost(AlphaBeta(alpha_s=1e-3, beta_s_per_byte=1e-9))
    predicted = bucket_tuning._predicted(ins, cost, (0.5, 0.25, 1, 64, 256))
    layouts = [bucket_views.ddp_rule(ins, bucket_sweep.cap_of(p)) for p in predicted.index]
    assert len(layouts) == len({str(p) for p in layouts}) and predicted.index[0] == "ddp:default"
    assert "ddp:0.25" in predicted.index and "ddp:0.5" not in predicted.index   # both cut after every tensor: the smaller named
    assert "ddp:256" not in predicted.index                                    # 64 MiB is already one bucket
    chosen = bucket_tuning._chosen(predicted, ins, measure=2)
    fastest = list(predicted.sort_values("step_ms").index)
    assert chosen[:2] == fastest[:2] and "ddp:default" in chosen
    split = [c for c in chosen if c.startswith("ddp-split:")]
    assert len(split) == 1 and len(bucket_views.ddp_rule(ins, bucket_sweep.cap_of(split[0]))[-1]) >= 2
    with pytest.raises(ValueError, match="^measure:"):
        bucket_tuning.tune_buckets(HF, 2, measure=0)


# ---- end to end: real ranks ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def warm_pair(tmp_path_factory):
    """Two warm ranks, pinned to cores as tune-buckets pins its own: the two bucket tunings and the frozen
    model's audit below run on them as jobs (each tool uses the current session when it fits), so their
    ranks start once instead of once per tool. The 3-rank audit runs before this opens, in its own launch."""
    with ddplab.Session(world_size=2, pin_cpus=True, runs_dir=tmp_path_factory.mktemp("warm-pair")) as s:
        yield s


@pytest.mark.slow
def test_audit_of_a_hugging_face_gpt2_against_independent_counts(tmp_path, capsys):
    transformers_or_skip()
    report = tmp_path / "audit.json"
    code = cli.main(["audit", "--model", HF, "--world-size", "3", "--optimizer", "adam", "--local-batch", "4",
                     "--bucket-cap-mb", "0.125", *[f"--{k.replace('_', '-')}={v}" for k, v in SMALL.items()],
                     "--json", str(report), "--out", str(tmp_path / "runs"), "--quiet"])
    assert code == 0, capsys.readouterr().err
    got = json.loads(report.read_text())
    exp = Experiment(model=HF, world_size=3, **SMALL)   # 3: the ring's 2(D-1)/D is not 1
    hf = models.build_with_data(exp).module
    trainable = [(n, p) for n, p in hf.named_parameters() if p.requires_grad]
    # the parameters, counted by Hugging Face itself
    assert got["model"]["parameters"] == hf.num_parameters() and got["model"]["ranks_agree"]
    assert got["comm"]["payload_bytes"] == sum(p.numel() for _, p in trainable) * 4
    assert abs(got["comm"]["written_over_formula"] - 1) < 0.05
    # every model-state category measured as predicted; adam holds two moments per element
    assert sorted(got["memory_mib"]) == ["0", "1", "2"]
    for rank in ("0", "1", "2"):
        mem = got["memory_mib"][rank]
        for c in ("parameters", "gradients", "ddp_buckets", "optimizer_state"):
            assert mem[f"{c}_measured_mib"] == mem[f"{c}_predicted_mib"], (rank, c, mem)
        # two moments per element (and a one-element step count per tensor), to the table's 3 decimals
        assert mem["optimizer_state_measured_mib"] == pytest.approx(2 * mem["parameters_measured_mib"], abs=2e-3)
    # the buckets, against torch's own rule (the C++ reducer's) on the ready order DDP saw in step 0
    run = ddplab.load_run(got["paths"]["ddp"])
    ready = [e.param for e in run.ranks[0].steps[0].backward.ready]
    tensors = dict(trainable)
    cap = int(0.125 * MIB)
    indices, _ = dist._compute_bucket_assignment_by_size([tensors[n].detach() for n in ready], [cap, cap])
    torch_rule = [[ready[i] for i in bucket] for bucket in indices]
    assert got["layout"] == torch_rule and len(torch_rule) > 2 and got["bucket_rule"]["matches"]
    assert got["last_bucket"] == torch_rule[-1] and [b["tensors"] for b in got["buckets"]] == [len(b) for b in torch_rule]
    assert sum(b["bytes"] for b in got["buckets"]) == got["comm"]["payload_bytes"]
    # the compute/comm ratio divides by the all-reduce of exactly the gradient's size, timed on these ranks
    assert got["comm"]["payload_bytes"] in tables.comm.allreduce_sweep(ddplab.load_run(got["paths"]["allreduce"])).index
    # the text report says the same
    text = capsys.readouterr().out
    assert f"model: {hf.num_parameters():,} parameters" in text and f"buckets DDP built after its rebuild ({len(torch_rule)}," in text
    assert "DDP's rule on the ready order it saw in step 0 gives exactly these buckets" in text


@pytest.mark.slow
def test_tune_buckets_on_an_image_model_measures_the_default_and_a_split_run_by_ddp(warm_pair, tmp_path):
    tuning = ddplab.tune_buckets("ddplab.examples.vision:small_cnn", 2, local_batch=8, caps_mb=(0.0001, 0.05, 0.5, 4),
                                 measure=2, rounds=2, steps=2, out=tmp_path, progress=False, d_model=32,
                                 compile_backend="aot_eager", compile_mode="no_optimization")
    measured = tuning.measured
    assert "ddp:default" in measured.index and "compute-only" in measured.index
    split = [p for p in measured.index if p.startswith("ddp-split:")]
    assert len(split) == 1
    run = ddplab.load_run(tuning.paths["measure"])
    ins = bucket_sweep.inputs(ddplab.load_run(tuning.paths["capture"]))
    uncut = bucket_views.ddp_rule(ins, bucket_sweep.cap_of(split[0]))
    assert bucket_views.is_last_split(bucket_views.plan_for(run, split[0], ins), uncut)   # DDP built the split
    assert tuning.best in measured.index and tuning.best != "compute-only"
    assert tuning.recommendation.startswith(("bucket_cap_mb=", "bucket_cap_mb_list=["))
    said = ("cannot tell" in tuning.verdict or "measured fastest" in tuning.verdict
            or "measured faster than DDP's default" in tuning.verdict or "DDP's default was faster" in tuning.verdict)
    assert said, tuning.verdict   # one of the four verdicts, in words; which one is the run's (verify() checks it)
    assert json.loads(json.dumps(tuning.to_dict()))["recommendation"] == tuning.recommendation
    tuning.verify(measure=2)   # notebook 05's check, passing on the real runs and failing on a wrong account
    from dataclasses import replace

    from ddplab.verify import CheckFailed
    with pytest.raises(CheckFailed):
        replace(tuning, measured=measured.drop(split)).verify(measure=2)
    beat = tuning.best != "ddp:default" and bucket_tuning.faster_than_default(bucket_sweep.steps(run), tuning.best).holds
    assert (tuning.recommendation == bucket_tuning.KEEP) == (not beat)   # the default is kept exactly when nothing beat it
    assert os.path.isdir(tuning.paths["measure"]) and "recommendation:" in tuning.text()
    # --compile: DDP's default and every measured cap DDPOptimizer could split at (not those under 1 MiB)
    compiled_caps = ["default", *(p.split(":")[1] for p in measured.index if p.startswith("ddp:") and p != "ddp:default"
                                  and float(p.split(":")[1]) >= 1)]
    assert list(tuning.compiled.steps.index) == [f"compiled:{c}/no_optimization" for c in compiled_caps]
    assert tuning.compiled.mode == "no_optimization" and not len(tuning.compiled.split)   # no split without DDPOptimizer
    assert (tuning.compiled.graphs["ddp_buckets_seen"] >= 1).all() and tuning.compiled.largest_param_gap <= 1e-4
    assert "not compiled: ddp-split:" in tuning.text() and json.dumps(tuning.to_dict(), allow_nan=False)


def test_the_bucket_rule_check_fails_on_buckets_ddp_did_not_build():
    from types import SimpleNamespace

    from ddplab.tools import audit

    ready = [("c", 1.0), ("b", 2.0), ("a", 3.0)]   # the order DDP saw in step 0
    rank0 = SimpleNamespace(steps=[SimpleNamespace(ready_ms=lambda: ready)])
    counted = factory.Counted(3, 3 * 2 ** 17, 3, 3 * 2 ** 17, 3 * 2 ** 19, {"a": 2 ** 19, "b": 2 ** 19, "c": 2 ** 19})
    exp = Experiment(world_size=2, bucket_cap_mb=1)   # 1 MiB: two 0.5 MiB gradients a bucket, in ready order
    assert audit._rule(exp, counted, rank0, [["c", "b"], ["a"]])["matches"]
    for wrong in ([["a", "b"], ["c"]], [["c"], ["b", "a"]], [["c", "b", "a"]]):   # source order; other cuts
        assert not audit._rule(exp, counted, rank0, wrong)["matches"], wrong


def test_the_audits_default_bucket_rule_is_torchs_own():
    """DDP's default caps (a 1 MiB first bucket, then 25 MiB) as the audit applies them, against the C++
    reducer's own assignment of the same tensors in the same ready order."""
    from types import SimpleNamespace

    from ddplab.tools import audit

    sizes = [300_000, 5_000, 700_000, 2_000_000, 4_100_000, 900_000, 3_000_000, 1_000, 6_000_000]   # elements
    names = [f"p{i}" for i in range(len(sizes))]
    ready = [(n, float(i)) for i, n in enumerate(names)]
    rank0 = SimpleNamespace(steps=[SimpleNamespace(ready_ms=lambda: ready)])
    counted = factory.Counted(len(sizes), sum(sizes), len(sizes), sum(sizes), 4 * sum(sizes),
                              {n: 4 * k for n, k in zip(names, sizes)})
    indices, _ = dist._compute_bucket_assignment_by_size([torch.empty(k) for k in sizes],
                                                         [dist._DEFAULT_FIRST_BUCKET_BYTES, 25 * MIB])
    torch_rule = [[names[i] for i in bucket] for bucket in indices]
    assert len(torch_rule) >= 3
    exp = Experiment(world_size=2)
    assert audit._rule(exp, counted, rank0, torch_rule)["matches"]
    assert not audit._rule(exp.replace(bucket_cap_mb=25), counted, rank0, torch_rule)["matches"]   # no 1 MiB first


@pytest.mark.slow
def test_audit_of_a_model_with_frozen_parameters_counts_only_what_ddp_reduces(warm_pair, tmp_path):
    # pinned like the tunings' ranks, so it is a job on the same warm ranks (pinning changes no count here)
    report = ddplab.audit_model("tests.support.user_models:with_frozen", 2, local_batch=4, out=tmp_path, progress=False,
                                vocab_size=256, d_model=32, compile_backend="aot_eager", pin_cpus=True)
    model = models.build(Experiment(model="tests.support.user_models:with_frozen", vocab_size=256, d_model=32))
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert report.model["trainable_tensors"] == len(trainable) < report.model["parameter_tensors"]
    assert report.comm["payload_bytes"] == sum(4 * p.numel() for p in trainable.values()) == report.model["gradient_bytes"]
    assert abs(report.comm["written_over_formula"] - 1) < 0.05
    assert sum(len(b) for b in report.layout) == len(trainable) and "emb.weight" not in report.ready_order.index
    tables.memory.verify_model_state(report.memory)
    assert "emb.weight" not in report.text().split("ready order")[1]
    # --compile: the same model under torch.compile on the same ranks; the frozen embedding is not a gradient there either
    c = report.compiled
    assert list(c.graphs["gradients_seen_ready"]) == [len(trainable)] and c.split_is_torchs
    assert c.split.loc["default", "graphs_recorded"] == c.split.loc["default", "graphs_compiled"] >= 1
    assert c.largest_param_gap <= 1e-4 and len(c.steps) == 1 and c.steps["first_step_s_compiled"].iloc[0] > 0
    data = json.loads(json.dumps(report.to_dict(), allow_nan=False))["compiled"]
    assert data["split_is_torchs"] and data["same_training"] and os.path.isdir(report.paths["compiled"])
    assert "the graphs the backend was handed are exactly the pieces of torch's recorded split" in report.text()


@pytest.mark.slow
def test_tune_buckets_runs_end_to_end_on_the_hugging_face_gpt2_from_the_command_line(warm_pair, tmp_path, capsys):
    transformers_or_skip()
    report = tmp_path / "tune.json"
    code = cli.main(["tune-buckets", "--model", HF, "--world-size", "2", "--local-batch", "2", "--measure", "1",
                     "--rounds", "2", "--steps", "2", "--caps", "0.0625,0.25,1", "--json", str(report),
                     "--out", str(tmp_path / "runs"), "--quiet", *[f"--{k.replace('_', '-')}={v}" for k, v in SMALL.items()]])
    assert code == 0, capsys.readouterr().err
    got = json.loads(report.read_text())
    hf = models.build_with_data(Experiment(model=HF, **SMALL)).module
    assert got["spec"]["tensors"] == len(list(hf.parameters()))   # every gradient's ready time was captured
    assert got["spec"]["gradient_mib"] == pytest.approx(hf.num_parameters() * 4 / MIB)
    plans = [r["plan"] for r in got["measured"]]
    assert "ddp:default" in plans and any(p.startswith("ddp-split:") for p in plans) and "compute-only" in plans
    assert f"recommendation: {got['recommendation']}" in capsys.readouterr().out


def test_the_launchers_checks_build_a_users_model_once_and_leave_its_random_stream_alone():
    """Preflight built a user's model twice (checked, then its activations measured)."""
    import torch

    from ddplab.launch.preflight import check_launch
    from tests.support import user_models

    user_models.BUILT.clear()
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    check_launch([Experiment(model="tests.support.user_models:counted", world_size=2)])
    assert len(user_models.BUILT) == 1
    assert torch.equal(torch.rand(3), expected)


def test_a_sweep_whose_times_do_not_grow_with_size_writes_no_infinite_bandwidth():
    """CI at f139c0f: a noisy 2-point sweep fitted beta = 0, and `tune-buckets --json` raised on inf."""
    import math
    import pandas as pd

    from ddplab.predict.comm import AlphaBeta, fit, quality

    sizes, times = [1e3, 1e6], [2e-3, 1.9e-3]     # the larger message measured no slower
    link = fit(sizes, times)
    assert link.beta_s_per_byte == 0 and math.isinf(link.bandwidth_bytes_per_s)   # the case is real
    line = bucket_tuning.line_of(link, quality(link, sizes, times))
    assert line["bandwidth_gb_s"] is None
    json.dumps(line, allow_nan=False)
    assert bucket_tuning.line_of(AlphaBeta(1e-4, 1e-9), quality(link, sizes, times))["bandwidth_gb_s"] == \
        pytest.approx(1.0)
    rows = factory.records(pd.DataFrame({"step_ms": [1.0, math.inf, math.nan]}, index=["a", "b", "c"]))
    assert [r["step_ms"] for r in rows] == [1.0, None, None]
    json.dumps(rows, allow_nan=False)


def test_the_audits_ratio_is_read_as_a_bound_never_as_overlap_promised():
    """A compute-to-communication ratio above 1 is only what overlap needs; the final bucket
    starts after backward's compute, so it stays exposed whatever the ratio."""
    from ddplab.tools.audit import _overlap_bound

    big = _overlap_bound({"compute_ms": 10.0, "allreduce_ms_line": 2.0, "compute_to_comm": 5.0,
                          "last_bucket_ms_line": 0.8}, 0.25)
    assert "not proof that it happens" in big and "at least 0.8 ms exposed" in big and "can hide" not in big
    small = _overlap_bound({"compute_ms": 2.0, "allreduce_ms_line": 5.0, "compute_to_comm": 0.4,
                            "last_bucket_ms_line": 1.0}, 0.5)
    assert "no overlap can hide all of it" in small and "at least 3.0 ms exposed" in small and "3.0 ms of all-reduce" in small
