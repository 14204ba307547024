"""Hub kernels off for every bench that loads a model: switch_off() before transformers is imported.

transformers 5.25 turns Hub kernels on by default (from_pretrained's use_kernels=None becomes True
unless USE_HUB_KERNELS says no) and then fetches compiled kernels for the device, which an offline
machine cannot and a benchmark must not. The environment switches are read by transformers and the
kernels package when they are imported; a worker or baseline process started afterwards inherits
them. load_kwargs() is passed to from_pretrained as well. Importing this module changes nothing
(the test suite imports some benches), so each script calls switch_off() where it starts.
"""

from __future__ import annotations

import os

ENV = {"USE_HUB_KERNELS": "0", "DISABLE_KERNEL_MAPPING": "1"}
"""transformers' switch (integrations/hub_kernels.py) and the kernels package's own (layer/globals.py)."""


def switch_off() -> None:
    os.environ.update(ENV)


def load_kwargs() -> dict:
    """{"use_kernels": False} where the installed transformers' from_pretrained reads it, else {}."""
    import inspect

    from transformers import PreTrainedModel

    return {"use_kernels": False} if "use_kernels" in inspect.getsource(PreTrainedModel.from_pretrained) else {}
