"""Inside a rank: hold each all-reduce's completion until the emulated link would have delivered it.

The experiment's `Link` (spec/link.py) is this process's network while the experiment runs:
`activate(link, world_size)` before the task, `deactivate()` after. A communication hook hands the
real collective's future to `hold(fut, n_bytes)` and returns what it gets back. One delivery thread
takes the transfers in the order they were handed over, waits for the real collective, and
completes the held future once

    start = max(real all-reduce finished, link free);  link free = done = start + link.wire_s(bytes)

has passed: the wire is serialized, as a real one is. With no active link `hold` returns the future
as it is. The hook body runs on the thread that called backward and the delivery on this module's
thread, so DDP's wait at the end of backward is what blocks (docs/ddp-internals.md, "Communication hooks").
"""

from __future__ import annotations

import queue
import threading
import time

_active: "_Wire | None" = None
CLOSE_S = 5.0


class _Wire:
    def __init__(self, link, world_size: int):
        self.link, self.world_size = link, world_size
        self.free_at = 0.0
        self.transfers: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._deliver, name="ddplab-link", daemon=True)
        self.thread.start()

    def hold(self, fut, n_bytes: int, calls: int = 1):
        import torch

        held = torch.futures.Future()
        self.transfers.put((fut, n_bytes, calls, held))
        return held

    def _deliver(self) -> None:
        while True:
            item = self.transfers.get()
            if item is None:
                return
            fut, n_bytes, calls, held = item
            try:
                value = fut.wait()
                start = max(time.perf_counter(), self.free_at)
                self.free_at = done = start + self.link.wire_s(n_bytes, self.world_size, calls)
                left = done - time.perf_counter()
                if left > 0:
                    time.sleep(left)
                held.set_result(value)
            except BaseException as e:  # noqa: BLE001 - the waiting rank must see the error, and later transfers still go
                if not held.done():
                    held.set_exception(e)

    def close(self) -> None:
        """Stop after the transfers handed over so far; a collective that never completes (the run
        failed) keeps the thread, a daemon, no longer than `CLOSE_S`."""
        self.transfers.put(None)
        self.thread.join(timeout=CLOSE_S)


def activate(link, world_size: int, device=None) -> None:
    """Put this process's all-reduces on `link` (None: loopback as it is). CPU tensors only: a held
    CUDA future would need its devices named, and an NCCL future's wait does not mean done."""
    global _active
    deactivate()
    if link is not None:
        if device is not None and getattr(device, "type", "cpu") != "cpu":
            raise ValueError(f"Experiment.link: the emulated link holds gloo all-reduces of CPU tensors; this rank "
                             f"runs on {device} (use backend='gloo', device='cpu')")
        _active = _Wire(link, world_size)


def deactivate() -> None:
    global _active
    if _active is not None:
        _active.close()
        _active = None


def hold(fut, n_bytes: int, calls: int = 1, bandwidth: float = 1.0):
    """`fut` (a real collective's future, or the last of a hook's `calls` all-reduces carrying `n_bytes`
    in all), completed no earlier than the active link delivers it; `bandwidth` times the link's rate
    (2: a link twice as fast, with the same latency)."""
    return fut if _active is None else _active.hold(fut, n_bytes / bandwidth, calls)
