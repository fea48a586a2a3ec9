"""Your own model: the factory contract (`Experiment.model = "package.module:factory"`).

ddplab imports `package.module` in every rank (and once in the launcher, to check it before anything
starts), calls `factory` with whichever of `vocab_size, seq_len, d_model, n_layers, n_heads,
tie_weights` it accepts as keyword arguments (the Experiment's values), and trains what it returns
with cross-entropy. The factory must be importable from the directory you run in (a `.py` file or an
installed package; a function defined in a notebook is not: ranks are other processes). Return either

- an `nn.Module` that maps token ids (batch, seq_len) to logits (batch, seq_len, vocab_size): the lab
  feeds it its own synthetic tokens (`rank/data.py`), as it does the built-in models; or
- `ModelWithData(model, batch)` when the model takes other inputs (images, features): `batch(sample_ids,
  seed)` returns `(inputs, targets)` for those examples, every example a pure function of `(seed, id)`
  (so any rank, and the single-process reference, rebuilds exactly the examples a rank saw), targets
  integer class ids of shape (batch, ...) and `model(inputs)` logits of shape targets.shape + (classes,).

The output may also be an object with a `.logits` tensor (a Hugging Face `ModelOutput`): the lab takes
`.logits`. Three factories written this way, each tested (tests/tools/test_own_model.py):

    # a Hugging Face model: a transformers config, random weights (ddplab/examples/hf_gpt2.py)
    def gpt2(vocab_size, seq_len, d_model, n_layers, n_heads):
        from transformers import GPT2Config, GPT2LMHeadModel
        return GPT2LMHeadModel(GPT2Config(vocab_size=vocab_size, n_positions=seq_len, n_embd=d_model,
                                          n_layer=n_layers, n_head=n_heads))   # its .logits are taken

    # a torchvision model: images in, so the data adapter comes with it (ddplab/examples/vision.py)
    def resnet18():
        import torchvision
        return ModelWithData(torchvision.models.resnet18(num_classes=10), batch=vision.images(10))

    # a plain nn.Module mapping token ids to logits (ddplab/examples/gpt2_style.py)
    def gpt2(vocab_size, seq_len, d_model, n_layers, n_heads): return GPT2Style(...)

A factory that raises, returns something else, gives logits of the wrong shape, or (for the audit and
tune tools) leaves trainable parameters without a gradient is refused before any rank starts, with a
ValueError that says what to change. Pure: no torch (the model is whatever the factory returns).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class ModelWithData:
    """A user's model and the examples it takes: `batch(sample_ids: list[int], seed: int) -> (inputs,
    targets)` with integer targets, `model(inputs)` logits of shape targets.shape + (classes,)."""

    model: Any
    batch: Callable

    def __post_init__(self):
        if not callable(self.batch):
            raise ValueError(f"ModelWithData.batch: must be a function (sample_ids, seed) -> (inputs, targets), "
                             f"got {type(self.batch).__name__}")
