"""Training a tiny random VLM of every proven family on generated images (backend/training/vision):
rows and labels, the parts that train or stay frozen, QLoRA's 16-bit tower, text rows beside image rows,
and one run end to end through `finetune-studio train` and the real worker."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from backend.core.config.run_config import RunConfig
from backend.core.registries.vision_families import VISION_FAMILIES
from backend.core.vision_folder import VisionFolder
from tests import vision_models

SIZES = [(120, 90), (140, 100), (96, 128)]
ANSWERS = ["Mostly red noise.", "Grey static, nothing else.", "A square of random pixels."]
SLOW = {"llava_next", "mllama"}
"""Families whose tiny model takes 4 to 12 s on two cores (LLaVA-NeXT's anyres grid, Mllama's 560-pixel tiles)."""


def write_data(folder: Path, text_row: bool = True) -> Path:
    """LLaMA-Factory rows (`<image>` + an images list) over generated PNGs, and one text-only row."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, ((width, height), answer) in enumerate(zip(SIZES, ANSWERS)):
        vision_models.image(width, height, seed=i).save(folder / f"im{i}.png")
        rows.append({"messages": [{"role": "user", "content": "<image>What is in this picture?"},
                                  {"role": "assistant", "content": answer}], "images": [f"im{i}.png"]})
    if text_row:
        rows.append({"messages": [{"role": "user", "content": "No picture this time."},
                                  {"role": "assistant", "content": "Then I see nothing."}]})
    path = folder / "train.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def run_config(model: Path, data: Path, **vision) -> RunConfig:
    return RunConfig.model_validate({
        "model": {"path": str(model)}, "data": {"path": str(data), "validation_split": 0},
        "technique": {"method": "lora", "lora_rank": 4, "lora_alpha": 8, "lora_dropout": 0.0, "packing": False},
        "vision": vision, "train": {"micro_batch_size": 4, "seq_len": 4096, "max_steps": 1, "seed": 0}})


def cpu_plan(config: RunConfig):
    from backend.core.protocol import Capabilities
    from backend.training.model.model_facts import ModelFacts
    from backend.training.model.techniques import plan_techniques

    return plan_techniques(config, Capabilities(cuda=False), ModelFacts.read(Path(config.model.path), False), 1)


def snapshot(model, needle: str) -> dict:
    return {n: p.detach().clone() for n, p in model.named_parameters() if needle in n}


@pytest.mark.parametrize("family", [pytest.param(f, marks=pytest.mark.slow) if f in SLOW else f
                                    for f in VISION_FAMILIES])
def test_every_family_trains_its_parts_as_the_vision_section_says(family, tmp_path):
    import torch

    from backend.training.model.vision_parts import LANGUAGE, PROJECTOR, TOWER, part_of
    from backend.training.vision.door import VisionRun, one_step
    from backend.training.vision.parts import plain_name

    folder = vision_models.build_tiny_vlm(family, tmp_path / family)
    config = run_config(folder, write_data(tmp_path / "data"), tower="lora", projector="full")
    run = VisionRun.open(folder, config)
    train, _, stats, rows = run.build_datasets(config)
    assert stats.train_examples == 4 and rows.image_rows == 3
    image_id = run.image_token_id
    tokenizer = run.processor.tokenizer
    for i in range(len(train)):
        ids, labels = train[i]["input_ids"], train[i]["labels"]
        taught = [t for t, label in zip(ids, labels) if label != -100]
        assert taught == [label for label in labels if label != -100] and image_id not in taught
        text = tokenizer.decode(taught)
        answer = (ANSWERS + ["Then I see nothing."])[train[i]["row"]]  # every row kept, in file order
        assert text.startswith(answer) and "picture" not in text, text  # the answer, never the prompt
        assert (train[i]["image_tokens"] > 0) == bool(rows.images[train[i]["row"]])

    config.train.micro_batch_size = 2  # two image rows: enough for every part, half the tiles
    model, batch = one_step(config, cpu_plan(config))
    family_parts = VISION_FAMILIES[family]
    by_part = {LANGUAGE: [], TOWER: [], PROJECTOR: []}
    for name, parameter in model.named_parameters():
        by_part.setdefault(part_of(plain_name(name), family_parts), []).append((name, parameter))
    if family == "mllama":  # random init leaves the cross-attention gates at tanh(0) = 0 (a trained model's are
        with torch.no_grad():  # open): then no gradient reaches the image side at all
            for name, parameter in model.named_parameters():
                if "_gate" in name and "cross_attn" in name:
                    parameter.fill_(1.0)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    for _ in range(2):  # two steps: Gemma 3's projector weight starts at zero, so its tower sees a gradient only then
        optimizer.zero_grad()
        loss = model(**batch).loss
        assert torch.isfinite(loss)
        loss.backward()
        optimizer.step()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])}
    tower_base = [n for n, _ in by_part[TOWER] if "lora_" not in n]
    assert tower_base and not changed & set(tower_base), "the tower's own weights moved"
    assert any("lora_B" in n for n, _ in by_part[TOWER] if n in changed), "no tower adapter trained"
    assert any("modules_to_save" in n for n, _ in by_part[PROJECTOR] if n in changed), "the projector did not train"
    assert not any(n in changed for n, _ in by_part[PROJECTOR] if "original_module" in n)
    assert any("lora_B" in n for n, _ in by_part[LANGUAGE] if n in changed)
    language_base = [n for n, _ in by_part[LANGUAGE] if "lora_" not in n]
    assert not changed & set(language_base)


def test_a_frozen_tower_and_projector_get_no_gradient(tmp_path):
    from backend.training.vision.door import one_step

    folder = vision_models.build_tiny_vlm("qwen2_5_vl", tmp_path / "m")
    config = run_config(folder, write_data(tmp_path / "data"))
    model, batch = one_step(config, cpu_plan(config))
    model(**batch).loss.backward()
    image_side = [(n, p) for n, p in model.named_parameters() if ".visual." in n]
    assert image_side and not any(p.requires_grad or p.grad is not None for _, p in image_side)
    assert any(p.grad is not None for n, p in model.named_parameters() if "language_model" in n and "lora_B" in n)


def test_a_text_only_row_in_an_image_dataset_trains(tmp_path):
    from backend.training.vision.door import VisionRun, add_vision_adapters, load_vision_model

    folder = vision_models.build_tiny_vlm("qwen2_5_vl", tmp_path / "m")
    config = run_config(folder, write_data(tmp_path / "data"))
    run = VisionRun.open(folder, config)
    train, _, _, rows = run.build_datasets(config)
    text_row = next(train[i] for i in range(len(train)) if not rows.images[train[i]["row"]])
    batch = run.collator(rows)([text_row])
    assert "pixel_values" not in batch and int((batch["labels"] != -100).sum()) > 0
    model = add_vision_adapters(load_vision_model(folder, config, cpu_plan(config), run.family), config,
                                cpu_plan(config), run.family)
    loss = model(**batch).loss
    loss.backward()
    assert loss.item() > 0 and any(p.grad is not None and p.grad.abs().sum() > 0
                                   for n, p in model.named_parameters() if "lora_" in n)


def test_truncation_never_cuts_an_image(tmp_path):
    from backend.training.vision.door import VisionRun

    folder = vision_models.build_tiny_vlm("qwen2_5_vl", tmp_path / "m")
    config = run_config(folder, write_data(tmp_path / "data"))
    run = VisionRun.open(folder, config)
    train, _, _, _ = run.build_datasets(config)
    first = train[0]["input_ids"].index(run.image_token_id)
    config.train.seq_len = first + min(VisionFolder.read(folder).tokens_per_image(w, h) for w, h in SIZES) - 1
    config.data.truncate = True  # seq_len ends inside every image's tokens, after the text row's prompt
    train, _, stats, rows = run.build_datasets(config)
    assert rows.image_cut == 3 and stats.train_examples == 1 and rows.image_rows == 0 and stats.truncated == 1
    assert len(train[0]["input_ids"]) == config.train.seq_len
    assert any("3 of 4 rows dropped" in note and "an image cannot be cut" in note for note in stats.notes)


def test_qlora_keeps_the_tower_and_projector_in_16_bit(tmp_path):
    import torch
    from transformers import AutoModelForImageTextToText
    from transformers.quantizers.quantizers_utils import should_convert_module

    from backend.training.model.vision_parts import LANGUAGE, part_of
    from backend.training.vision.door import quantization_config

    folder = vision_models.build_tiny_vlm("qwen3_vl", tmp_path / "m")
    family = VISION_FAMILIES["qwen3_vl"]
    plan = SimpleNamespace(quantization="nf4", load_dtype=torch.bfloat16, precision="bf16")
    config = run_config(folder, tmp_path / "none.jsonl")
    bnb = quantization_config(config, plan, family)
    assert bnb.load_in_4bit and bnb.bnb_4bit_quant_type == "nf4"
    skip = bnb.llm_int8_skip_modules
    model = AutoModelForImageTextToText.from_pretrained(folder)
    linears = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    for name in linears:  # transformers' own matching decides what bitsandbytes converts
        in_language = part_of(name + ".", family) == LANGUAGE and name != "lm_head"
        assert should_convert_module(name, skip) == in_language, name
    assert quantization_config(config, SimpleNamespace(quantization="int8", load_dtype=torch.float16,
                                                       precision="fp16"), family).llm_int8_skip_modules == skip


def test_start_takes_a_proven_vlm_and_refuses_an_unproven_one(tmp_path):
    from backend.core.errors import JobError
    from backend.training.model.model_check import check_model_folder

    folder = vision_models.build_tiny_vlm("mllama", tmp_path / "m")  # its embedding holds vocab_size + 8 rows
    config = run_config(folder, tmp_path / "none.jsonl")
    assert check_model_folder(config) == folder
    raw = json.loads((folder / "config.json").read_text())
    raw["model_type"] = "paligemma"
    (folder / "config.json").write_text(json.dumps(raw))
    with pytest.raises(JobError, match="not proven"):
        check_model_folder(config)


def test_a_vlm_trains_through_the_cli_and_reports_its_images(tmp_path, capsys):
    from backend.cli.app import main
    from backend.core.paths import runs_dir

    folder = vision_models.build_tiny_vlm("qwen2_5_vl", tmp_path / "m")
    data = write_data(tmp_path / "data")
    yaml = tmp_path / "run.yaml"
    yaml.write_text(f"""schema_version: 1
name: vlm
model: {{path: {folder}}}
data: {{path: {data}, validation_split: 0}}
technique: {{method: lora, lora_rank: 8, lora_alpha: 16, lora_dropout: 0.0}}
vision: {{projector: full}}
train: {{max_steps: 6, micro_batch_size: 4, learning_rate: 0.01, warmup_steps: 0, seq_len: 1024, save_steps: 100,
        logging_steps: 1, seed: 1}}
""")
    assert main(["train", str(yaml)]) == 0
    captured = capsys.readouterr()
    out = captured.out + captured.err  # the progress lines go to stderr, the summary to stdout
    run = next(runs_dir().glob("*-vlm-*"))
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    metrics = [e for e in events if e["type"] == "MetricsLogged"]
    assert len(metrics) == 6 and metrics[-1]["loss"] < metrics[0]["loss"]
    plan = next(e["detail"] for e in events if e["type"] == "PhaseChanged" and e["phase"] == "plan")
    assert "image rows: shortcuts packed_image_rows" in plan  # technique.packing is on by default
    vision = VisionFolder.read(folder)
    per_step = sum(vision.tokens_per_image(w, h) for w, h in SIZES)
    assert [m["image_rows_seen"] for m in metrics] == [3 * k for k in range(1, 7)]
    assert [m["image_tokens_seen"] for m in metrics] == [per_step * k for k in range(1, 7)]
    assert "3 with images" in out and f"18 image rows, {6 * per_step:,} image tokens" in out
    assert (run / "adapter" / "adapter_model.safetensors").is_file()
    assert (run / "adapter" / "preprocessor_config.json").is_file()


def test_a_lora_part_under_full_tuning_is_refused_before_loading(tmp_path):
    from backend.core.errors import JobError
    from backend.training.vision.door import VisionRun

    config = run_config(tmp_path / "no-model", tmp_path / "none.jsonl", tower="lora")
    config.technique.method = "full"
    with pytest.raises(JobError, match="vision.tower: lora needs a LoRA technique"):
        VisionRun.open(tmp_path / "no-model", config)


def test_preparing_for_4_bit_training_leaves_the_frozen_tower_16_bit(tmp_path):
    import torch
    from transformers import AutoModelForImageTextToText

    from backend.training.model.vision_parts import LANGUAGE, PROJECTOR, TOWER, part_of
    from backend.training.vision.parts import keep_image_side_dtype

    folder = vision_models.build_tiny_vlm("qwen2_5_vl", tmp_path / "m")
    family = VISION_FAMILIES["qwen2_5_vl"]
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.bfloat16)
    config = run_config(folder, tmp_path / "none.jsonl", tower="frozen", projector="full")

    def upcast(m):  # what peft's prepare_model_for_kbit_training does to every unquantized 16-bit weight
        for p in m.parameters():
            p.data = p.data.float()
        return m

    model = keep_image_side_dtype(model, family, config, upcast)
    dtypes = {part: {p.dtype for n, p in model.named_parameters() if part_of(n, family) == part}
              for part in (LANGUAGE, TOWER, PROJECTOR)}
    assert dtypes == {LANGUAGE: {torch.float32}, TOWER: {torch.bfloat16}, PROJECTOR: {torch.float32}}


@pytest.mark.slow
def test_a_vlm_runs_adapter_exports_and_passes_its_check(tmp_path, capsys):
    from backend.cli.app import main
    from backend.core.paths import runs_dir
    from tests.conftest import PRESET

    folder = vision_models.build_tiny_vlm("qwen2_5_vl", tmp_path / "m")
    data = write_data(tmp_path / "data")
    assert main(["train", str(PRESET), "--set", f"model.path={folder}",
                 "--set", f"data.path={data}", "--set", "data.validation_split=0", "--set", "train.max_steps=2",
                 "--set", "vision.projector=full", "--set", "train.seq_len=1024"]) == 0
    run = next(runs_dir().glob("*-tiny-lora-*"))
    assert main(["export", str(run), "--format", "adapter"]) == 0
    assert "PASSED: adapter export" in capsys.readouterr().out


def test_gemma3_text_rows_keep_the_text_path_and_image_rows_take_the_door(tmp_path):
    """Gemma 3 trained as text before its images did: its text rows keep the text path (its speed shortcuts,
    DPO/KTO/GRPO); rows with images, or a tuned tower, take the image door. Qwen2.5-VL always takes it."""
    from backend.training.vision.door import takes_door

    gemma, qwen = (vision_models.build_tiny_vlm(name, tmp_path / name) for name in ("gemma3", "qwen2_5_vl"))
    text = tmp_path / "text.jsonl"
    text.write_text(json.dumps({"messages": [{"role": "user", "content": "Hi"},
                                             {"role": "assistant", "content": "Hello"}]}) + "\n")
    pictures = write_data(tmp_path / "pictures")
    assert not takes_door(gemma, run_config(gemma, text))
    assert takes_door(gemma, run_config(gemma, pictures)) and takes_door(gemma, run_config(gemma, text, tower="lora"))
    assert takes_door(qwen, run_config(qwen, text))
