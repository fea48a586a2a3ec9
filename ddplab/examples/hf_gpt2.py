"""A Hugging Face model as a model factory (`model="ddplab.examples.hf_gpt2:gpt2"`): `transformers`'
own GPT-2 (`GPT2LMHeadModel`) built from a `GPT2Config` at the experiment's sizes, with random
weights (nothing is downloaded). Its forward returns a `ModelOutput`; the lab takes `.logits`
(spec/model.py). Needs `pip install transformers`; without it the factory says so.
"""

from __future__ import annotations


def gpt2(vocab_size: int, seq_len: int, d_model: int, n_layers: int, n_heads: int):
    """transformers' GPT-2 LM at these sizes (GPT-2 small: 50257, 1024, 768, 12, 12); dropout off, so
    every rank's forward is the same function of its batch, and no special tokens past the vocabulary."""
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError as e:
        raise ImportError(f"this factory needs Hugging Face transformers: pip install transformers ({e})") from None
    config = GPT2Config(vocab_size=vocab_size, n_positions=seq_len, n_embd=d_model, n_layer=n_layers, n_head=n_heads,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
                        use_cache=False)
    return GPT2LMHeadModel(config)
