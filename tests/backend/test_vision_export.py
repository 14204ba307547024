"""Exports of a vision-language run (backend/export): the merged image-text model with its processor, checked on
the run's image rows and reloaded with AutoModelForImageTextToText; bitsandbytes with the tower kept 16-bit;
GGUF of a family without an mmproj layout refused in one line before a worker starts (calibrated formats:
test_vision_calibrated.py; GGUF pairs: test_vision_gguf.py). Tiny random VLMs (tests/vision_models.py)
trained 2 steps through the CLI on generated images."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import vision_models
from tests.backend.test_vision_training import write_data
from tests.conftest import PRESET

def train(tmp: Path, family: str, **vision: str) -> Path:
    """A finished 2-step LoRA run of the family's tiny VLM (vision: the tower/projector settings)."""
    from backend.cli.app import main
    from backend.core.paths import runs_dir

    folder = vision_models.build_tiny_vlm(family, tmp / family)
    data = write_data(tmp / "data")
    sets = [f"model.path={folder}", f"data.path={data}", "data.validation_split=0", "train.max_steps=2",
            "train.seq_len=2048", "train.learning_rate=0.01", f"name={family}"]
    sets += [f"vision.{part}={how}" for part, how in vision.items()]
    assert main(["train", str(PRESET), *[a for s in sets for a in ("--set", s)]]) == 0
    return next(runs_dir().glob(f"*-{family}-*"))


def image_inputs(folder: Path, family: str) -> dict:
    """One generated image and a question, through the processor saved in `folder`."""
    from backend.training.model.vision_processor import load_vision_processor

    processor = load_vision_processor(folder)
    text = f"{vision_models.PROMPT_IMAGE.get(family, '<image>')}What is in this picture?"
    return dict(processor(text=[text], images=[[vision_models.image(100, 80, seed=7)]], return_tensors="pt"))


def logits(model, inputs: dict):
    import torch

    dtype = model.get_input_embeddings().weight.dtype
    with torch.no_grad():
        return model(**{k: v.to(dtype) if v.is_floating_point() else v for k, v in inputs.items()}).logits.float()


@pytest.mark.slow  # 15 to 35 s each on two cores: the fast merge test below checks the tensors against peft
@pytest.mark.parametrize("family,vision", [("qwen2_5_vl", {"projector": "full"}),
                                           ("llava", {"tower": "lora", "projector": "full"}),
                                           ("idefics3", {"projector": "lora"})])
def test_a_vlm_runs_merged_export_passes_on_its_images_and_reloads_as_trained(family, vision, tmp_path, capsys):
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForImageTextToText

    from backend.cli.app import main
    from backend.core.runs.run_folder import RunFolder
    from backend.export.merge import TrainedRun, load_trained

    run = train(tmp_path, family, **vision)
    assert main(["export", str(run), "--format", "merged"]) == 0
    assert "PASSED: merged export" in capsys.readouterr().out
    out = run / "exports" / "merged"
    report = json.loads((out / "export_report.json").read_text())
    perplexity = next(c for c in report["checks"] if c["name"] == "perplexity")
    assert "rows with their images" in perplexity["what"]
    assert {p.name for p in out.iterdir()} & {"preprocessor_config.json", "processor_config.json"}

    exported = AutoModelForImageTextToText.from_pretrained(out, dtype=torch.bfloat16).eval()
    config = RunFolder(run).load_config()
    trained = load_trained(TrainedRun.check(run, config, "merged"), torch.bfloat16, "cpu")
    inputs = image_inputs(out, family)
    got, expected = logits(exported, inputs), logits(trained, inputs)
    assert (got - expected).abs().max() < 0.05 * expected.abs().max()
    assert (got.argmax(-1) == expected.argmax(-1)).float().mean() > 0.9

    if vision.get("projector") == "full":  # the trained projector, not the base's
        with safe_open(run / "adapter" / "adapter_model.safetensors", "pt") as adapter:
            key = next(k for k in adapter.keys() if "lora_" not in k and k.endswith("weight"))
            name = key.removeprefix("base_model.model.")
            saved = adapter.get_tensor(key)
        base = AutoModelForImageTextToText.from_pretrained(tmp_path / family, dtype=torch.bfloat16)
        untrained = dict(base.named_parameters())[name]
        written = dict(exported.named_parameters())[name]
        assert torch.equal(written, saved.to(torch.bfloat16))
        assert not torch.equal(written, untrained.to(torch.bfloat16))


@pytest.mark.slow
def test_bnb_4bit_of_a_vlm_run_keeps_the_tower_16_bit(tmp_path, capsys):
    import bitsandbytes as bnb
    import torch
    from transformers import AutoModelForImageTextToText

    from backend.cli.app import main

    run = train(tmp_path, "qwen2_5_vl", projector="full")
    assert main(["export", str(run), "--format", "bnb-4bit"]) == 0
    assert "PASSED: bnb-4bit export" in capsys.readouterr().out
    model = AutoModelForImageTextToText.from_pretrained(run / "exports" / "bnb-4bit", dtype=torch.bfloat16)
    quantized = {n for n, m in model.named_modules() if isinstance(m, bnb.nn.Linear4bit)}
    assert quantized and all(n.startswith("model.language_model.") for n in quantized)
    assert all(p.dtype == torch.bfloat16 for n, p in model.named_parameters() if n.startswith("model.visual."))


def test_a_format_a_vlm_run_cannot_export_is_refused_before_a_worker_starts(tmp_path, monkeypatch, capsys):
    import backend.cli.worker_process
    from backend.cli.app import main
    from backend.core.errors import JobError
    from backend.core.runs.run_folder import RunFolder
    from backend.export.merge import TrainedRun

    run = train(tmp_path, "llava")  # no mmproj layout: its GGUF is refused
    monkeypatch.setattr(backend.cli.worker_process, "WorkerProcess",
                        lambda *a, **k: pytest.fail("a worker was started"))
    capsys.readouterr()
    for fmt, missing in (("gguf-q8_0", "the mmproj half"),):  # GGUF of the families it writes: test_vision_gguf.py
        assert main(["export", str(run), "--format", fmt]) == 2
        line = capsys.readouterr().err.strip().splitlines()[-1]
        assert line.startswith(f"error: {fmt} of a LLaVA-1.5 run is not built yet ({missing}")
        assert line.endswith("export --format adapter, merged, bnb-8bit, bnb-4bit, gptq-int4, awq-int4 or w8a8")
        with pytest.raises(JobError, match=f"{fmt} of a LLaVA-1.5 run is not built yet"):  # the job refuses too
            TrainedRun.check(run, RunFolder(run).load_config(), fmt)


IMAGE_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.content is string %}{{ m.content }}"
                  "{% else %}{% for part in m.content %}{% if part.type == 'image' %}<image>{% else %}{{ part.text }}"
                  "{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
                  "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
"""A chat template that renders OpenAI image parts, as published VLMs' templates do (the tiny models carry the
bundled text model's, which renders a message's content as one string)."""


@pytest.mark.slow
def test_serve_answers_an_image_url_for_a_merged_llava_export(tmp_path, capsys):
    import base64
    import io
    import signal

    from openai import OpenAI

    from backend.cli.app import main
    from backend.core.vision_folder import VisionFolder
    from tests.backend.test_serve import start_cli

    run = train(tmp_path, "llava", projector="full")
    assert main(["export", str(run), "--format", "merged"]) == 0
    export = run / "exports" / "merged"
    (export / "chat_template.jinja").write_text(IMAGE_TEMPLATE)
    buffer = io.BytesIO()
    vision_models.image(64, 48, seed=3).save(buffer, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    served = start_cli(export)
    try:
        client = OpenAI(base_url=f"http://127.0.0.1:{served['port']}/v1", api_key=served["token"], timeout=120)
        reply = client.chat.completions.create(model=served["model"], max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "What is in this picture?"}]}])
        assert 0 < reply.usage.completion_tokens <= 4
        assert reply.usage.prompt_tokens > VisionFolder.read(export).tokens_per_image(64, 48)  # the image's tokens
    finally:
        served["process"].send_signal(signal.SIGINT)
        assert served["process"].wait(60) == 0


def test_serve_says_in_one_line_why_transformers_cannot_load_a_qwen_vl_processor(tmp_path, capsys):
    from backend.cli.app import main
    from backend.serving.engines import installed

    if installed("torchvision"):
        pytest.skip("torchvision is installed: the server builds the video processor")
    folder = vision_models.build_tiny_vlm("qwen2_5_vl", tmp_path / "m")
    assert main(["serve", str(folder), "--device", "cpu", "--port", "0"]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("error: transformers serve builds Qwen2.5-VL's processor with its video processor, which "
                           "needs torchvision") and "pip install torchvision" in line


def test_the_streaming_merge_of_a_vlm_adapter_with_a_full_projector_equals_peft(tmp_path):
    """Without training: a LoRA on the language model and the tower plus a projector in modules_to_save, merged
    tensor by tensor (fp32) and reloaded, equals peft's merge_and_unload parameter for parameter."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForImageTextToText

    from backend.export.adapter_weights import AdapterWeights
    from backend.export.checkpoint_files import CheckpointFiles
    from backend.export.merged_source import MergedSource
    from backend.export.model_layout import ModelLayout
    from backend.export.safetensors_writer import write_safetensors

    folder = vision_models.build_tiny_vlm("qwen2_5_vl", tmp_path / "m")
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=r".*(language_model.*q_proj|visual.blocks.*qkv)",
                        modules_to_save=["model.visual.merger"])
    peft_model = get_peft_model(model, config)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name or "modules_to_save" in name:
                param.add_(torch.randn_like(param) * 0.1)
    peft_model.save_pretrained(tmp_path / "adapter")
    expected = {n: p.detach().clone() for n, p in peft_model.merge_and_unload().named_parameters()}

    files = CheckpointFiles(folder)
    layout = ModelLayout.build(folder, files.shapes())
    adapter = AdapterWeights(tmp_path / "adapter", layout)
    assert adapter.replaced and all("merger" in name for name in adapter.replaced)
    (tmp_path / "merged").mkdir()
    write_safetensors(MergedSource(files, layout, adapter, torch.float32), tmp_path / "merged")
    (tmp_path / "merged" / "config.json").write_bytes((folder / "config.json").read_bytes())
    merged = AutoModelForImageTextToText.from_pretrained(tmp_path / "merged", dtype=torch.float32)
    got = dict(merged.named_parameters())
    assert got.keys() == expected.keys()
    assert all(torch.allclose(got[n], expected[n], atol=1e-6) for n in expected), \
        [n for n in expected if not torch.allclose(got[n], expected[n], atol=1e-6)]
