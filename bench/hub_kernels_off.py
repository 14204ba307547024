"""Hub kernels off for every bench that loads a model: import this before transformers.

transformers 5.25 turns Hub kernels on by default (from_pretrained's use_kernels=None becomes True
unless USE_HUB_KERNELS says no) and then fetches compiled kernels for the device, which an offline
machine cannot and a benchmark must not. The environment switches are set here, before transformers
or the kernels package is imported (both read them then), and LOAD_KWARGS is passed to from_pretrained.
"""

from __future__ import annotations

import os

ENV = {"USE_HUB_KERNELS": "0", "DISABLE_KERNEL_MAPPING": "1"}
"""transformers' switch (integrations/hub_kernels.py) and the kernels package's own (layer/globals.py)."""

os.environ.update(ENV)


def load_kwargs() -> dict:
    """{"use_kernels": False} where the installed transformers' from_pretrained reads it, else {}."""
    import inspect

    from transformers import PreTrainedModel

    return {"use_kernels": False} if "use_kernels" in inspect.getsource(PreTrainedModel.from_pretrained) else {}
