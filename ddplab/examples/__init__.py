"""Networks written the way a user writes their own, as model factories (`model="module:factory"`):
they go through the same path as a practitioner's model, and every rank, test and exercise can
import them. `gpt2_style`: GPT-2's layout and parameter names (the practice exercise); `matrices`: no
bias and no norm (notebook 10: PowerSGD compresses every tensor).
`guarded_training.py` is not a model but a plain torchrun training script with `ddplab.guard` in it and
each silent DDP bug switchable (notebook 08, `tests/guard/`)."""
