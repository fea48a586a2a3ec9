"""Notebook 11, compiled DDP: readiness, DDPOptimizer's split and the step, eager against compiled."""

from __future__ import annotations

from ..spec import CompiledDdp, Experiment

# the practice exercise's GPT-2-style network (a user's model factory): 4 blocks, 0.86 M parameters
COMPILE_MODEL = dict(model="ddplab.examples.gpt2_style:gpt2", vocab_size=256, d_model=128, n_layers=4, n_heads=4,
                     seq_len=32, local_batch=4)


def eager_and_compiled(world_size: int = 2, caps_mb=(None, 1.0, 2.0), backend: str = "aot_eager", rounds: int = 6,
                       steps: int = 2, modes=("ddp_optimizer",), pin_cpus: bool = True, **overrides) -> Experiment:
    """Notebook 11: per cap in `caps_mb` (None: DDP's default), DDP eager and `torch.compile`d with
    `backend` (aot_eager: AOTAutograd's graphs run by eager kernels, compiled in about a second on
    2 cores; Inductor's code generation takes about 15 s here), warmed up, then `rounds` interleaved
    rounds of `steps` steps, under each `optimize_ddp` mode of `modes`."""
    task = CompiledDdp(caps_mb=tuple(caps_mb), backend=backend, rounds=rounds, steps_per_round=steps, modes=tuple(modes))
    fields = dict(name=f"compiled-ddp-w{world_size}", task=task, world_size=world_size, pin_cpus=pin_cpus,
                  **COMPILE_MODEL)
    return Experiment(**{**fields, **overrides})
