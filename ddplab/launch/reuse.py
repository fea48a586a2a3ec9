"""Whether a launch reuses warm ranks: the current session when it fits, a new one when wanted
(`run(warm=...)`, $DDPLAB_WARM, or by default in a Jupyter kernel), else cold."""

from __future__ import annotations

import os

from ..spec import Experiment
from .session import Session, current


def wanted(warm: bool | None) -> bool:
    """Should a launch that no session fits start one? `warm` as `run` got it (None: the default)."""
    if warm is not None:
        return bool(warm)
    env = os.environ.get("DDPLAB_WARM", "").strip().lower()
    if env in ("1", "true", "yes", "on"):
        return True
    if env in ("0", "false", "no", "off"):
        return False
    from .progress import in_notebook

    return in_notebook()


def for_launch(exps: list[Experiment], backend: str, device: str, warm: bool | None, startup_timeout_s: float,
               say=None) -> Session | None:
    """The session these experiments run on (the current one if it fits, else a new one when
    `wanted(warm)`), or None: launch cold. `say` gets a line before a new session starts."""
    from .cells import restart_finished

    restart_finished()   # ranks restarting after a hung %%ddp cell come up first
    if warm is False:
        return None
    s = current()
    if s is not None and s.fits(exps, backend, device):
        return s
    pins = {e.pin_cpus for e in exps}
    if not wanted(warm) or len(pins) > 1 or (s is not None and not s.implicit):
        return None   # the user's own session stays as it is
    world_size = max(e.world_size for e in exps)   # the old one, if `run` started it, leaves in Session()
    if say is not None:
        say(f"ddplab: starting a session of {world_size} warm ranks on {backend}/{device} "
            f"(later runs that fit reuse them)")
    return Session(world_size, backend, device, pins.pop(), startup_timeout_s=startup_timeout_s, implicit=True)
