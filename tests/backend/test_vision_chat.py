"""Chat and evaluation with images on a tiny random Qwen2.5-VL run trained a few steps here: `finetune-studio
chat RUN --image` answers base then tuned, a text model's run refuses an image in one line, a chat session
answers a ChatMessage with images, and `finetune-studio eval` scores the held-out image rows (perplexity of
the answers, exact match of the generated ones)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backend.core.config.run_config import RunConfig
from backend.core.runs.run_folder import RunFolder
from backend.cli.worker_process import WorkerProcess
from tests import vision_models

ANSWER = "Red."
ROWS = 8


def write_rows(folder: Path) -> Path:
    """Eight image rows, every answer the same short one: a few steps teach it, so the tuned model's
    perplexity on the held-out rows must fall below the base's."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(ROWS):
        vision_models.image(64 + 8 * i, 56, seed=i).save(folder / f"im{i}.png")
        rows.append({"messages": [{"role": "user", "content": "<image>Which colour?"},
                                  {"role": "assistant", "content": ANSWER}], "images": [f"im{i}.png"]})
    path = folder / "train.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


@pytest.fixture(scope="module")
def vlm_run(tmp_path_factory) -> tuple[RunFolder, RunConfig, Path]:
    root = tmp_path_factory.mktemp("vlmchat")
    model = vision_models.build_tiny_vlm("qwen2_5_vl", root / "model")
    data = write_rows(root / "data")
    config = RunConfig.model_validate({
        "name": "vlm-chat", "model": {"path": str(model)}, "data": {"path": str(data), "validation_split": 0.25},
        "technique": {"method": "lora", "lora_rank": 8, "lora_alpha": 16, "lora_dropout": 0.0, "packing": False},
        "vision": {"projector": "full"},
        "train": {"max_steps": 8, "micro_batch_size": 3, "learning_rate": 0.02, "warmup_steps": 0,
                  "seq_len": 512, "save_steps": 1000, "eval_steps": 1000, "logging_steps": 1, "seed": 1,
                  "cpu_threads": 1}})
    folder = RunFolder.create(config, root=root / "runs")
    terminal = WorkerProcess().run(folder, config)
    assert terminal["type"] == "JobFinished", terminal
    return folder, config, data.parent


def test_cli_chat_with_an_image_answers_base_then_tuned(vlm_run, capsys):
    from backend.cli.app import main

    folder, _, images = vlm_run
    code = main(["chat", str(folder.path), "Which colour?", "--image", str(images / "im0.png"), "--model", "both",
                 "--temperature", "0", "--max-new-tokens", "4"])
    out = capsys.readouterr()
    assert code == 0, out.err
    lines = out.out.splitlines()
    assert lines[0] == "[base]" and "[tuned]" in lines
    base, tuned = lines[1], lines[lines.index("[tuned]") + 1]
    assert base.strip() and tuned.strip() and tuned != base, out.out  # eight steps moved the tuned model's answer


def test_a_session_answers_a_message_with_images_and_refuses_a_missing_one(vlm_run):
    from backend.jobs.chat import ChatRequest
    from backend.jobs.chat_session import ChatSession
    from backend.evaluation.run_models import RunModels
    from backend.core.errors import JobError
    from backend.core.protocol import Capabilities, ChatMessage
    from tests.backend.test_chat import Collect, Stop

    folder, config, images = vlm_run
    message = ChatMessage(messages=[{"role": "user", "content": "Which colour?"}],
                          images=[str(images / "im1.png")], temperature=0, max_new_tokens=3)
    assert message.params()["images"] == [str(images / "im1.png")]
    collect = Collect()
    session = ChatSession(RunModels(folder.path, config, Capabilities(cuda=False)), collect, Stop())
    finished = session.answer(ChatRequest(message.params()))
    assert finished.tokens > 0
    streamed = "".join(e.text for e in collect.events if e.type == "TokensGenerated")
    assert streamed.strip() and "".join(e.detail for e in collect.events if e.type == "PhaseChanged"
                                        and e.phase == "generate") == "tuned"
    gone = message.model_copy(update={"images": [str(images / "nothing.png")]})
    with pytest.raises(JobError, match="nothing.png: a missing image"):
        session.answer(ChatRequest(gone.params()))
    two = message.model_copy(update={"messages": [{"role": "user", "content": "<image> and <image>?"}]})
    with pytest.raises(JobError, match="2 <image> markers for 1 images"):
        session.answer(ChatRequest(two.params()))


def test_an_image_for_a_text_model_is_refused_in_one_line(tmp_path, bundled_model, capsys):
    from backend.cli.app import main
    from backend.evaluation.image_prompts import NO_IMAGES
    from tests.conftest import PRESET

    vision_models.image(32, 32, seed=0).save(tmp_path / "a.png")
    config = RunConfig.load(PRESET, ["name=text-run"])
    folder = RunFolder.create(config, root=tmp_path / "runs")
    code = main(["chat", str(folder.path), "What is this?", "--image", str(tmp_path / "a.png")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and NO_IMAGES in err[0], err
    assert not (folder.path / "worker.log").exists() or "chat" not in (folder.path / "worker.log").read_text()


def test_the_chat_job_refuses_images_for_a_text_model(tmp_path):
    from backend.core.errors import JobError
    from backend.evaluation.image_prompts import NO_IMAGES
    from backend.jobs.chat_session import ChatSession
    from tests.backend.test_chat import Collect, Stop
    from types import SimpleNamespace

    models = SimpleNamespace(family=None, base_path=tmp_path, require_tuned=lambda: None)
    request = SimpleNamespace(which=["tuned"], messages=[{"role": "user", "content": "hi"}], images=["a.png"],
                              max_new_tokens=4, temperature=0.0, top_p=1.0, seed=None)
    with pytest.raises(JobError, match=NO_IMAGES):
        ChatSession(models, Collect(), Stop()).answer(request)


def test_eval_scores_the_held_out_image_rows_base_beside_tuned(vlm_run, capsys):
    from backend.cli.app import main

    folder, _, _ = vlm_run
    prompts = folder.path.parent / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "Which colour?", "expected": ANSWER}) + "\n")
    code = main(["eval", str(folder.path), "--max-new-tokens", "4", "--prompts", str(prompts)])
    out = capsys.readouterr()
    assert code == 0, out.err
    report = json.loads((folder.path / "eval_report.json").read_text())
    ppl, em = report["perplexity"], report["exact_match"]
    assert ppl["examples"] == 2 and ppl["image_rows"] == 2  # 25% of the eight rows, every one with an image
    assert ppl["tokens"] > 0 and ppl["tuned"]["perplexity"] < ppl["base"]["perplexity"]
    assert em["n"] == 2 and em["images"] == 2 and em["base"]["hits"] == 0
    assert [e["expected"] for e in report["examples"]] == [ANSWER, ANSWER]
    assert all(e["prompt"] == "<image>Which colour?" and len(e["images"]) == 1 for e in report["examples"])
    assert report["skipped"] == [f"prompts file {prompts} not read: a vision-language run is scored on its "
                                 "held-out image rows"]
    assert "perplexity" in out.out and "exact match" in out.out and "validation image rows" in out.out
