"""Build resources/adapters/tiny-yes-no/: the bundled tiny model after the tiny_lora preset's SFT run.

GRPO needs a model that sometimes answers the demo task right: the bundled base never says "yes" or
"no" (p < 0.001), so no completion earns a reward and nothing is learnt. Real GRPO starts from an
instruction-tuned model the same way; tiny_grpo.yaml starts from this adapter (model.adapter). Its
greedy answers are right on the held-out demo prompts, sampled ones at temperature 1 about 60% of
the time, which leaves GRPO room to show the reward rising.

    python scripts/build_tiny_adapter.py [--out resources/adapters/tiny-yes-no]   (~30 s on 2 cores)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRESET = ROOT / "resources" / "presets" / "tiny_lora.yaml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "resources" / "adapters" / "tiny-yes-no")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as home:
        env = dict(os.environ, FINETUNE_STUDIO_HOME=home)
        subprocess.run([sys.executable, "-m", "backend.cli", "train", str(PRESET), "--set", "name=tiny-yes-no"],
                       check=True, cwd=ROOT, env=env)
        adapter = next(Path(home, "runs").glob("*tiny-yes-no*")) / "adapter"
        args.out.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(adapter / "adapter_model.safetensors", args.out / "adapter_model.safetensors")
        meta = json.loads((adapter / "adapter_config.json").read_text(encoding="utf-8"))
        meta["base_model_name_or_path"] = "bundled:tiny"
        (args.out / "adapter_config.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
