"""fsdpviz: see, per FSDP unit, whether parameter all-gathers hide behind compute.

Layers import downward only: ``cli -> record`` and ``cli -> trace -> analysis -> report``.
``trace`` and ``analysis`` never import torch, holoviews or bokeh.
"""

__version__ = "0.1.0"
