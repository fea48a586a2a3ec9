"""Views: ipywidgets controls for the notebooks; ipywidgets loads on use. Each control redraws from a
pure model (no ranks are launched), so a slider move takes milliseconds; a "measure" button calls
the `measure` function the notebook hands it (`ddplab.run`), never the launcher directly.

    gradients (01), memory (02), buckets (05)
"""

from .buckets import bucket_slider
from .gradients import rank_weights_explorer
from .memory import memory_explorer

__all__ = ["bucket_slider", "memory_explorer", "rank_weights_explorer"]
