"""Presets for real models: each one loads, names its model, fits the card it is sized for by the
estimate on that model's real config.json, and its header's Cost line is that estimate."""

from __future__ import annotations

import pytest

from backend.core.config.run_config import RunConfig
from backend.estimate import GIB, estimate
from backend.core.paths import HUB_PREFIX
from backend.api.presets import list_presets, load_preset, parse_card
from tests import model_configs
from tests.conftest import ROOT

PRESETS = [p for p in list_presets(ROOT / "resources" / "presets") if p.hub_id]
ASKED = {  # the list: model, method, card
    ("Qwen/Qwen2.5-0.5B-Instruct", "lora", "8 GB"), ("meta-llama/Llama-3.2-1B-Instruct", "lora", "12 GB"),
    ("Qwen/Qwen2.5-1.5B-Instruct", "lora", "12 GB"), ("meta-llama/Llama-3.1-8B-Instruct", "qlora", "16 GB"),
    ("meta-llama/Llama-3.1-8B-Instruct", "qlora", "24 GB"), ("Qwen/Qwen3-8B", "qlora", "24 GB"),
    ("google/gemma-3-4b-it", "lora", "24 GB"), ("meta-llama/Llama-3.3-70B-Instruct", "qlora", "2x80 GB"),
    ("Qwen/Qwen2.5-VL-7B-Instruct", "qlora", "16 GB"), ("HuggingFaceTB/SmolVLM-256M-Instruct", "lora", "8 GB"),
    # Asked as QLoRA on 48 GB; bitsandbytes leaves transformers 5's fused experts unquantized (the file says why).
    ("Qwen/Qwen3-30B-A3B", "lora", "80 GB"),
}


def test_the_asked_presets_exist():
    have = {(p.hub_id, RunConfig.load(p.path).technique.method, p.card_label) for p in PRESETS}
    assert ASKED <= have, ASKED - have


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.name)
def test_preset_fits_its_card_by_the_estimate(preset):
    config = RunConfig.load(preset.path)
    assert config.model.path == HUB_PREFIX + preset.hub_id
    assert preset.title and preset.when and preset.cost and preset.card_gb
    assert config.hardware.world_size == preset.cards
    folder = preset.hub_id.replace("/", "--")
    assert folder in model_configs.names(), f"no tests/fixtures/model_configs/{folder}/config.json"
    b = estimate(model_configs.CONFIGS_DIR / folder, config, device="cuda", num_gpus=preset.cards)
    assert b.details["model"]["measured"], b.details["warnings"]
    assert b.total_bytes <= 0.95 * preset.card_gb * GIB, f"{b.total_bytes / GIB:.1f} GiB on a {preset.card_label} card"
    assert f"estimated peak {b.total_bytes / GIB:.1f} GiB" in preset.cost, "run scripts/preset_costs.py --write"


def test_header_parsing(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("# Title: A\n# Card: 2x80 GB\n# Model: org/name\n# When to use: first line,\n#   and more.\n"
                    "# Cost: x\nname: a\n# Title: not the header any more\n", encoding="utf-8")
    preset = load_preset(path)
    assert (preset.title, preset.card_gb, preset.cards, preset.hub_id) == ("A", 80, 2, "org/name")
    assert preset.when == "first line, and more." and preset.card_label == "2x80 GB"
    assert parse_card("CPU") == (0, 1) and parse_card("24 GB") == (24, 1)


def test_a_preset_before_its_download_is_one_line_and_after_it_estimates(studio_home):
    import shutil

    from backend.core.errors import JobError
    from backend.core.paths import hub_folder
    from backend.training.model.loading import check_model_folder

    preset = next(p for p in PRESETS if p.hub_id == "Qwen/Qwen2.5-0.5B-Instruct")
    config = RunConfig.load(preset.path)
    with pytest.raises(ValueError, match="is not downloaded yet") as caught:
        estimate(config.model.path, config, device="cuda")
    assert "hf download Qwen/Qwen2.5-0.5B-Instruct" in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(JobError, match="is not downloaded yet"):
        check_model_folder(config)
    folder = hub_folder(preset.hub_id)  # what the Model page's download leaves (config.json is enough here)
    folder.mkdir(parents=True)
    shutil.copy(model_configs.CONFIGS_DIR / "Qwen--Qwen2.5-0.5B-Instruct" / "config.json", folder / "config.json")
    assert f"{estimate(config.model.path, config, device='cuda').total_bytes / GIB:.1f} GiB" in preset.cost


def test_the_readmes_preset_table_says_each_presets_cost_line():
    """The README's table of presets for real cards repeats each header's estimated peak: both move together."""
    import re


    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `([a-z0-9._-]+)` \|.*\| ([\d.]+) GiB(?: per GPU)? \|$", readme, re.M))
    headers = {}
    for path in sorted((ROOT / "resources" / "presets").glob("*.yaml")):
        found = re.search(r"^# Cost: estimated peak ([\d.]+) GiB", path.read_text(encoding="utf-8"), re.M)
        if found:
            headers[path.stem] = found.group(1)
    assert rows == headers
