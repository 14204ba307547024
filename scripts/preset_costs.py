"""Print (or --write) every preset's Cost line from the memory estimate on its model's real config.json.

The config.json files are the test fixtures (tests/fixtures/model_configs/<org>--<name>/config.json), so
the numbers need no download; tests/backend/test_presets.py fails when a file's line drifts from this.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from backend.core.config.run_config import RunConfig  # noqa: E402
from backend.estimate import estimate  # noqa: E402
from backend.api.presets import Preset, cost_line, list_presets  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "model_configs"


def preset_cost(preset: Preset) -> str:
    config = RunConfig.load(preset.path)
    model = FIXTURES / preset.hub_id.replace("/", "--")
    b = estimate(model, config, device="cuda", num_gpus=preset.cards)
    parts = b.breakdown()
    tokens = (b.details.get("vision") or {}).get("image_tokens_per_row", 0)
    return cost_line(config, b.total_bytes, parts, preset.card_gb, preset.cards, tokens)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite each file's Cost line")
    args = parser.parse_args()
    for preset in list_presets(ROOT / "resources" / "presets"):
        if not preset.hub_id:
            continue
        line = preset_cost(preset)
        print(f"{preset.name}: {line}")
        if args.write:
            text = preset.path.read_text(encoding="utf-8")
            text = re.sub(r"^# Cost: .*$", lambda _, line=line: f"# Cost: {line}", text, count=1, flags=re.M)
            preset.path.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
