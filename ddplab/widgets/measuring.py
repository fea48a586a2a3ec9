"""One measurement at a time, for a widget's "measure" button (notebooks 02 and 05).

While a measurement runs the button is disabled and spins, a click that reaches the kernel meanwhile
is dropped (ipykernel 7 may deliver it on another thread at once, or queue it until the first one
returns: a click handled within `SETTLE_S` of the end was made while the button was disabled), and the
work gets the settings of the moment of the click, so its result can say what it measured.
"""

from __future__ import annotations

import threading
import time

SETTLE_S = 0.5


class OneAtATime:
    def __init__(self, button, busy: str = "measuring..."):
        self.button, self.busy = button, busy
        self.idle = (button.description, button.icon)
        self.lock = threading.Lock()
        self.finished_at = -SETTLE_S
        self.runs = 0   # measurements started (a double click must add one)

    def handler(self, work):
        """An `on_click` handler that runs `work()` unless a measurement is running or just ended."""
        def on_click(_):
            if time.monotonic() - self.finished_at < SETTLE_S or not self.lock.acquire(blocking=False):
                return
            self.runs += 1
            self.button.disabled, self.button.description, self.button.icon = True, self.busy, "spinner"
            try:
                work()
            finally:
                self.button.disabled = False
                self.button.description, self.button.icon = self.idle
                self.finished_at = time.monotonic()
                self.lock.release()
        return on_click


def measure_with_progress(measure, exp, label):
    """`measure(exp)`, handing it `progress=` (a callable that sets `label`'s text) when it takes one,
    as `ddplab.run` does; a user's `lambda e: ...` that takes no such argument still works."""
    import inspect

    try:
        params = inspect.signature(measure).parameters.values()
    except (TypeError, ValueError):
        params = []
    if any(p.name == "progress" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return measure(exp, progress=lambda line: setattr(label, "value", line))
    return measure(exp)
