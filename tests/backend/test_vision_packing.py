"""The proof the `packed_image_rows` shortcut cites: image rows of different sizes packed into one row
(backend/training/vision/packed_collator.py) give the loss and gradients of the same rows padded, within
1e-5 in fp32 with dropout off, for each family the registry names; what FlashAttention-2 would be handed;
the plan line for a packable family and for one that is not; and a run through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from backend.core.config.run_config import RunConfig
from backend.core.registries.shortcuts import BY_NAME, IMAGE_PACKING_REFUSED, PACKED_IMAGE_FAMILIES
from backend.core.registries.vision_families import VISION_FAMILIES
from tests import vision_models
from tests.backend.test_packed_flash import flash_probe  # noqa: F401 (the fixture)

ROWS = [  # (images as (width, height), answer): three sizes, two images in one row, one row without any
    ([(120, 90)], "Mostly red noise."),
    ([(200, 60), (64, 64)], "Two strips of static."),
    ([], "Then I see nothing."),
    ([(96, 128)], "A tall square of random pixels."),
]


def write_rows(folder: Path, rows=ROWS) -> Path:
    """LLaMA-Factory rows over generated PNGs."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, (sizes, answer) in enumerate(rows):
        names = []
        for j, (width, height) in enumerate(sizes):
            vision_models.image(width, height, seed=10 * i + j).save(folder / f"im{i}_{j}.png")
            names.append(f"im{i}_{j}.png")
        prompt = "<image>" * len(names) + ("What is in this picture?" if names else "No picture this time.")
        lines.append({"messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}],
                      "images": names})
    path = folder / "train.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in lines) + "\n")
    return path


def run_config(model: Path, data: Path, packing: bool = True) -> RunConfig:
    return RunConfig.model_validate({
        "model": {"path": str(model)}, "data": {"path": str(data), "validation_split": 0},
        "technique": {"method": "lora", "lora_rank": 4, "lora_alpha": 8, "lora_dropout": 0.0, "packing": packing,
                      "precision": "fp32"},
        "vision": {"tower": "lora", "projector": "full"},
        "train": {"micro_batch_size": 4, "seq_len": 1024, "max_steps": 1, "seed": 0}})


def plan(config: RunConfig):
    from backend.core.protocol import Capabilities
    from backend.training.model.model_facts import ModelFacts
    from backend.training.model.techniques import plan_techniques

    return plan_techniques(config, Capabilities(cuda=False), ModelFacts.read(Path(config.model.path), False), 1, 1,
                           image_rows=True)


@pytest.fixture
def cuts(monkeypatch):
    """The row bounds sdpa_packed reads per forward (packed_attention._example_bounds, cached per forward)."""
    from backend.training.shortcuts import packed_attention

    seen: list = []
    read = packed_attention._read_bounds
    monkeypatch.setattr(packed_attention, "_read_bounds", lambda *a: seen.append(read(*a)) or seen[-1])
    packed_attention.register()
    return seen


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("vlm_packing")
    data = write_rows(root / "data")
    return {family: vision_models.build_tiny_vlm(family, root / family) for family in sorted(PACKED_IMAGE_FAMILIES)}, data


def model_and_rows(folder: Path, data: Path, attention: str = "sdpa"):
    """The run's model (LoRA on the language model and tower, B != 0; the projector full) and its rows."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForImageTextToText

    from backend.training.vision import parts
    from backend.training.vision.door import VisionRun

    config = run_config(folder, data)
    run = VisionRun.open(folder, config)
    train, _, _, rows = run.build_datasets(config)
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32, attn_implementation=attention)
    model.config.use_cache = False
    torch.manual_seed(1)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=parts.lora_targets(model, run.family, config),
                      modules_to_save=parts.saved_modules(model, run.family, config), init_lora_weights=False,
                      task_type="CAUSAL_LM")
    model = get_peft_model(model, lora)
    parts.set_trainable(model, run.family, config)
    return model, run, [train[i] for i in range(len(train))], rows


def loss_and_grads(model, batch):
    model.zero_grad()
    loss = model(**batch).loss
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    return loss.detach(), grads


@pytest.mark.parametrize("attention", ["sdpa_packed", "sdpa"])
@pytest.mark.parametrize("family", sorted(PACKED_IMAGE_FAMILIES))
def test_packed_image_rows_give_the_padded_loss_and_gradients(family, attention, folders, cuts):
    """sdpa_packed (what the job loads on SDPA: one causal SDPA per row) and plain SDPA (transformers'
    block-diagonal mask from the restarting positions)."""
    built, data = folders
    model, run, features, rows = model_and_rows(built[family], data, attention)
    model.eval()  # dropout off (the tiny configs have none; LoRA's is 0)
    padded = run.collator(rows)(features)
    packed = run.collator(rows, model)(features)
    lengths = [len(f["input_ids"]) for f in features]
    assert "attention_mask" not in packed and packed["input_ids"].shape == (1, sum(lengths))
    assert packed["position_ids"].shape == (4, 1, sum(lengths))
    assert packed["position_ids"][0, 0].tolist() == [i for n in lengths for i in range(n)]
    assert torch.equal(packed["pixel_values"], padded["pixel_values"])
    assert packed["image_grid_thw"].shape[0] == 4  # four images, in row order
    plain_loss, plain_grads = loss_and_grads(model, padded)
    cuts.clear()
    loss, grads = loss_and_grads(model, packed)
    bounds = [0, *torch.tensor(lengths).cumsum(0).tolist()]
    per_row = [c for c in cuts if c is not None]  # the text layers' cuts (the tower's chunks find none)
    assert per_row == ([bounds] if attention == "sdpa_packed" else []), per_row
    assert abs(loss - plain_loss) < 1e-5, (family, loss, plain_loss)
    assert plain_grads.keys() == grads.keys()
    worst = max((grads[n] - plain_grads[n]).abs().max().item() for n in grads)
    assert worst < 1e-5, (family, worst)
    for part in ("visual", "language_model"):  # gradients reach both sides, so both were compared
        assert any(plain_grads[n].abs().max() > 0 for n in grads if part in n and "lora_B" in n), part
    text_only = [f for f in features if not rows.images[f["row"]]] * 2  # no image in the batch at all
    with torch.no_grad():
        plain_loss = model(**run.collator(rows)(text_only)).loss
        loss = model(**run.collator(rows, model)(text_only)).loss
    assert abs(loss - plain_loss) < 1e-5, (family, "text rows only", loss, plain_loss)


def test_rows_that_attend_across_each_other_would_not_pass(folders):
    """The check above can fail: the same packed row read as one example (positions not restarting)."""
    built, data = folders
    model, run, features, rows = model_and_rows(built["qwen2_5_vl"], data)
    model.eval()
    plain_loss, _ = loss_and_grads(model, run.collator(rows)(features))
    packed = run.collator(rows, model)(features)
    packed["position_ids"][0] = torch.arange(packed["input_ids"].shape[1])
    loss, _ = loss_and_grads(model, packed)
    assert abs(loss - plain_loss) > 1e-4


def test_flash_attention_gets_each_rows_bounds_from_the_positions(folders, flash_probe):  # noqa: F811
    """On CUDA with FlashAttention-2 the text layers take the varlen path with the rows' bounds, read from
    the restarting text positions; the loss is the padded one. flash-attn needs CUDA, so its kernel is stood
    in for by per-sequence SDPA (test_packed_flash.py); the vision tower (its own per-image bounds) runs SDPA."""
    built, data = folders
    probe = {"text_config": "fa2_probe", "vision_config": "sdpa", "": "sdpa"}
    model, run, features, rows = model_and_rows(built["qwen2_5_vl"], data, attention=probe)
    model.eval()
    packed = run.collator(rows, model)(features)
    assert not any(key.startswith("cu_seq_lens") for key in packed)  # the tower would take them as its own
    loss, _ = loss_and_grads(model, packed)
    lengths = [len(f["input_ids"]) for f in features]
    bounds = [0, *torch.tensor(lengths).cumsum(0).tolist()]
    causal = [call for call in flash_probe if call[4]]
    assert len(causal) == len(flash_probe) == 2  # both text layers, varlen, with the rows' bounds
    assert all(call[0] == bounds and call[2] == max(lengths) for call in causal)
    reference, _ = model_and_rows(built["qwen2_5_vl"], data, attention="eager")[0:2]
    reference.eval()
    plain_loss, _ = loss_and_grads(reference, run.collator(rows)(features))
    assert abs(loss - plain_loss) < 1e-5


def test_the_registry_names_every_proven_vision_family():
    shortcut = BY_NAME["packed_image_rows"]
    assert shortcut.rows == {"image"} and shortcut.families == PACKED_IMAGE_FAMILIES
    assert PACKED_IMAGE_FAMILIES <= BY_NAME["sdpa_packed"].families and "image" in BY_NAME["sdpa_packed"].rows
    types = {t for family in VISION_FAMILIES.values() for t in family.model_types}
    assert types == PACKED_IMAGE_FAMILIES | IMAGE_PACKING_REFUSED.keys()
    assert not PACKED_IMAGE_FAMILIES & IMAGE_PACKING_REFUSED.keys()


def test_the_plan_packs_qwen_rows_and_says_why_not_for_gemma3(folders, tmp_path):
    built, data = folders
    qwen = plan(run_config(built["qwen2_5_vl"], data))
    assert qwen.shortcuts.applied == ("packed_image_rows", "sdpa_packed")
    assert "image rows: shortcuts packed_image_rows, sdpa_packed" in qwen.summary()
    from backend.training.shortcuts.installer import attention_implementation

    assert attention_implementation(qwen) == "sdpa_packed"  # what load_vision_model asks for
    off = plan(run_config(built["qwen2_5_vl"], data, packing=False))
    assert not off.shortcuts.applied and "packed_image_rows: packing off" in off.summary()
    assert "sdpa_packed: image rows not packed" in off.summary()
    gemma = vision_models.build_tiny_vlm("gemma3", tmp_path / "gemma3")
    refused = plan(run_config(gemma, data))
    assert not refused.shortcuts.applied
    assert f"packed_image_rows: {IMAGE_PACKING_REFUSED['gemma3']}" in refused.summary()


def train_through_cli(folder: Path, data: Path, name: str, tmp_path: Path) -> list[dict]:
    """`finetune-studio train` with packing on (the default); the run's events."""
    from backend.cli.app import main
    from backend.core.paths import runs_dir

    yaml = tmp_path / f"{name}.yaml"
    yaml.write_text(f"""schema_version: 1
name: {name}
model: {{path: {folder}}}
data: {{path: {data}, validation_split: 0}}
technique: {{method: lora, lora_rank: 4, lora_alpha: 8, lora_dropout: 0.0, packing: true}}
train: {{max_steps: 1, micro_batch_size: 4, learning_rate: 0.01, warmup_steps: 0, seq_len: 1024, save_steps: 100,
        logging_steps: 1, seed: 1}}
""")
    assert main(["train", str(yaml)]) == 0
    run = next(runs_dir().glob(f"*-{name}-*"))
    return [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]


def phase(events: list[dict], name: str) -> str:
    return " | ".join(e["detail"] for e in events if e["type"] == "PhaseChanged" and e["phase"] == name)


def test_a_gemma3_run_says_why_its_image_rows_train_padded(folders, tmp_path):
    """The Qwen2.5-VL run through the CLI packs (test_vision_training.py's, with packing on by default)."""
    _, data = folders
    gemma = vision_models.build_tiny_vlm("gemma3", tmp_path / "gemma3")
    events = train_through_cli(gemma, data, "padded", tmp_path)
    why = IMAGE_PACKING_REFUSED["gemma3"]
    assert f"packed_image_rows: {why}" in phase(events, "plan")
    assert f"packing is off for image rows ({why})" in phase(events, "data_warning")
    assert [e["image_rows_seen"] for e in events if e["type"] == "MetricsLogged"] == [3]


def test_the_estimate_packs_image_rows_where_the_job_does():
    """Every row of a micro-batch brings its images, packed or not; a packed Qwen2.5-VL micro-batch is one
    row of micro-batch x seq_len tokens, a Gemma 3 one (padded: its reason above) micro-batch rows."""
    from backend.estimate import estimate
    from tests import model_configs

    def config(batch: int, packing: bool = True) -> RunConfig:
        return RunConfig.model_validate({
            "model": {"path": "x"}, "data": {"path": "x.jsonl"},
            "technique": {"method": "lora", "packing": packing, "gradient_checkpointing": True},
            "train": {"seq_len": 1024, "micro_batch_size": batch}, "vision": {"max_pixels": 301056}})

    qwen = model_configs.CONFIGS_DIR / "Qwen--Qwen2.5-VL-7B-Instruct"
    one, four = (estimate(qwen, config(b), device="cuda", images_per_row=1) for b in (1, 4))
    assert four.pixel_values == 4 * one.pixel_values
    padded = estimate(qwen, config(4, packing=False), device="cuda", images_per_row=1)
    assert padded.pixel_values == four.pixel_values and padded.total_bytes != four.total_bytes
    gemma = model_configs.CONFIGS_DIR / "google--gemma-3-4b-it"
    assert (estimate(gemma, config(4), device="cuda", images_per_row=1).total_bytes
            == estimate(gemma, config(4, packing=False), device="cuda", images_per_row=1).total_bytes)
