"""Hub kernels stay off. Torch-free.

transformers 5 turns Hub kernels on by default (`from_pretrained(use_kernels=None)` becomes True) and
then fetches compiled code for the device from the Hub: offline that fails at model load, online it runs
code the user never asked for. Every model load passes LOAD_KWARGS, and the worker's environment carries
OFF_ENV, which transformers (USE_HUB_KERNELS) and the kernels package (DISABLE_KERNEL_MAPPING) read.
"""

from __future__ import annotations

import os
from typing import Any

OFF_ENV: dict[str, str] = {"USE_HUB_KERNELS": "0", "DISABLE_KERNEL_MAPPING": "1"}
LOAD_KWARGS: dict[str, Any] = {"use_kernels": False}


def switch_off(environ: dict[str, str] | os._Environ | None = None) -> None:
    """Put OFF_ENV into `environ` (this process's by default); before transformers is imported."""
    target = os.environ if environ is None else environ
    target.update(OFF_ENV)
