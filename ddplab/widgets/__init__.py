"""Views: ipywidgets controls for the notebooks, each called as `widgets.<module>.<control>(...)`;
ipywidgets loads on use. Each control redraws from a pure model (no ranks are launched), so a slider
move takes milliseconds; a "measure" button calls the `measure` function the notebook hands it
(`ddplab.run`), never the launcher directly.

    gradients (01), memory (02), buckets (05), plan (12); measuring: the button's run in the background
"""

from . import buckets, gradients, measuring, memory, plan
