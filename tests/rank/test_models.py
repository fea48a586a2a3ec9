import sys
import textwrap

import pytest
import torch

from ddplab import Experiment
from ddplab.predict.memory import parameter_numels
from ddplab.rank import models


@pytest.mark.parametrize("name", ["transformer", "mlp"])
def test_builtin_models_map_tokens_to_logits(name):
    exp = Experiment(model=name, vocab_size=37, seq_len=9)
    model = models.build(exp)
    models.check_model(model, exp)
    assert model(torch.zeros(3, 9, dtype=torch.long)).shape == (3, 9, 37)


def test_build_is_deterministic_from_the_seed():
    a, b = models.build(Experiment(seed=3)), models.build(Experiment(seed=3))
    c = models.build(Experiment(seed=4))
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not all(torch.equal(p, q) for p, q in zip(a.parameters(), c.parameters()))


def test_tied_weights_share_one_parameter():
    tied = models.build(Experiment(tie_weights=True))
    untied = models.build(Experiment(tie_weights=False))
    assert tied.head.weight is tied.tok_emb.weight
    assert models.parameter_count(untied) - models.parameter_count(tied) == tied.head.weight.numel()


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_nets.py").write_text(textwrap.dedent("""
        import torch.nn as nn
        def small(vocab_size, d_model):
            return nn.Sequential(nn.Embedding(vocab_size, d_model), nn.Linear(d_model, vocab_size))
        def wrong_shape(vocab_size):
            return nn.Embedding(vocab_size, 3)
        def not_a_module():
            return 42
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("my_nets", None)


def test_user_factory_gets_the_keywords_it_accepts(user_module):
    exp = Experiment(model="my_nets:small", vocab_size=11, d_model=6)
    model = models.build(exp)
    models.check_model(model, exp)
    assert model[0].weight.shape == (11, 6)


@pytest.mark.parametrize("model,match", [
    ("my_nets:wrong_shape", "must map token ids"), ("my_nets:not_a_module", "not an nn.Module"),
    ("my_nets:missing", "has no attribute 'missing'"), ("no_such_module_xyz:f", "cannot import"),
])
def test_bad_user_models_raise_value_error_naming_model(user_module, model, match):
    exp = Experiment(model=model)
    with pytest.raises(ValueError, match=rf"Experiment\.model.*{match}"):
        models.check_model(models.build(exp), exp)


def test_branchy_defines_its_head_first_and_counts_its_parameters_analytically():
    exp = Experiment(model="branchy", vocab_size=20, d_model=8)
    model = models.build(exp)
    assert [n for n, _ in model.named_parameters()][:2] == ["head.weight", "head.bias"]
    assert parameter_numels(exp) == [p.numel() for p in model.parameters()]
    models.check_model(model, exp)


def test_checkpointing_gives_the_same_gradients():
    plain, ckpt = models.build(Experiment(seed=1)), models.build(Experiment(seed=1, checkpointing=True))
    x = torch.randint(64, (2, 16))
    for m in (plain, ckpt):
        m(x).square().mean().backward()
    assert all(torch.allclose(p.grad, q.grad, atol=1e-6) for p, q in zip(plain.parameters(), ckpt.parameters()))
