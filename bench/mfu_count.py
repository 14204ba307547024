"""The preset's MFU as the worker counts it (the FLOPs that run) and as the old count had it (every
position's output projection and last layer, as if no shortcut skipped them), from one in-process run.

    python bench/mfu_count.py                                   # resources/presets/tiny_lora.yaml
    python bench/mfu_count.py --set technique.shortcuts=off     # both counts agree
"""

from __future__ import annotations

import io
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str]) -> int:
    os.environ["FINETUNE_STUDIO_HOME"] = tempfile.mkdtemp(prefix="mfu-home-")
    from backend.core.cpu_features import RUNTIME_ENV

    for name, value in RUNTIME_ENV.items():  # as in the worker, before torch loads
        os.environ.setdefault(name, value)
    import torch

    from backend.core.config.run_config import RunConfig
    from backend.training.model.capabilities import default_threads

    torch.set_num_threads(default_threads())  # the worker's starting count
    from backend.jobs import finetune
    from backend.runtime.reporter import Reporter
    from backend.runtime.stop_listener import StopListener

    overrides = [a for flag, a in zip(argv, argv[1:]) if flag == "--set"]
    seen = {}
    callback_class = finetune.ReportingCallback

    class Watched(callback_class):  # the job's own callback, kept for its counts
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            seen["callback"] = self

    finetune.ReportingCallback = Watched
    run = Path(tempfile.mkdtemp(prefix="mfu-run-")) / "run"
    run.mkdir()
    reporter = Reporter(io.StringIO())
    reporter.attach_run(run)
    finetune.run_finetune(RunConfig.load(ROOT / "resources/presets/tiny_lora.yaml", overrides), run, reporter,
                          StopListener(io.StringIO()))
    cb = seen["callback"]
    tokens, heads, rows = (a - b for a, b in zip(cb._counts, cb._counts_at_start))
    old = cb.token_flops.per_token * tokens / cb._train_seconds / cb.peak_flops
    print(f"MFU as it runs {cb.mfu():.1%}; by the old count of every position {old:.1%} ({old / cb.mfu():.2f}x); "
          f"{cb.tokens_per_s():.0f} useful tokens/s; {tokens} computed tokens, logits at {heads}, last-layer rows "
          f"{rows}; peak {cb.peak_flops / 1e9:.1f} GFLOP/s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
