"""bench/gpu_check.sh's parts that a CPU can prove: the worker hook (memory cap, profiler), the steady-state
window, the summary table, and Hub kernels switched off before transformers loads in the benches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
HOOK = BENCH / "gpu_hook"
sys.path.insert(0, str(BENCH))


def hook_run(tmp_path: Path, code: str, env: dict, fake: dict[str, str] | None = None) -> list[dict]:
    """Run `code` in a fresh interpreter with the hook (and fake packages) on PYTHONPATH; -> the hook's log."""
    fakes = tmp_path / "fakes"
    for name, source in (fake or {}).items():
        path = fakes / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    log = tmp_path / "hook.log"
    paths = [str(HOOK)] + ([str(fakes)] if fake else [])
    full = {**os.environ, **env, "GPU_CHECK_HOOK_LOG": str(log), "PYTHONPATH": os.pathsep.join(paths)}
    subprocess.run([sys.executable, "-c", code], env=full, check=True, cwd=tmp_path, timeout=120)
    return [json.loads(line) for line in log.read_text().splitlines()]


FAKE_TORCH = """
import json, os
class cuda:
    @staticmethod
    def is_available(): return True
    @staticmethod
    def mem_get_info(): return (90 * 2**30, 100 * 2**30)
    @staticmethod
    def memory_reserved(): return 0
    @staticmethod
    def set_per_process_memory_fraction(fraction):
        open(os.environ["FAKE_OUT"], "w").write(json.dumps(fraction))
"""


def test_memory_cap_is_applied_once_torch_is_imported(tmp_path):
    out = tmp_path / "fraction.json"
    env = {"GPU_CHECK_MEMORY_CAP_BYTES": str(24 * 2**30), "FAKE_OUT": str(out)}
    log = hook_run(tmp_path, "import torch", env, {"torch/__init__.py": FAKE_TORCH})
    cap = next(e for e in log if e["hook"] == "memory_cap")
    # the card's 24 GiB less the 10 GiB the fake context holds, as a fraction of the 100 GiB card
    assert cap["applied"] and cap["context_bytes"] == 10 * 2**30
    assert json.loads(out.read_text()) == pytest.approx(14 / 100)


def test_memory_cap_takes_the_context_measured_up_front(tmp_path):
    out = tmp_path / "fraction.json"
    env = {"GPU_CHECK_MEMORY_CAP_BYTES": str(24 * 2**30), "GPU_CHECK_CONTEXT_BYTES": str(2**30), "FAKE_OUT": str(out)}
    hook_run(tmp_path, "import torch", env, {"torch/__init__.py": FAKE_TORCH})
    assert json.loads(out.read_text()) == pytest.approx(23 / 100)


def test_the_hook_does_nothing_unasked_and_says_why_it_cannot_cap_without_cuda(tmp_path):
    assert [e["hook"] for e in hook_run(tmp_path, "import json", {})] == ["imported"]
    log = hook_run(tmp_path, "import torch", {"GPU_CHECK_MEMORY_CAP_BYTES": "1000"})  # the real, CPU-only torch
    cap = next(e for e in log if e["hook"] == "memory_cap")
    assert cap["applied"] is False and cap["why"] == "no CUDA device"


def test_every_trainer_gets_the_profiler_and_writes_the_table(tmp_path):
    fake = {"transformers/__init__.py": "class TrainerCallback: pass\n",
            "transformers/trainer.py": """
                class Trainer:
                    def __init__(self): self.callbacks = []
                    def add_callback(self, cb): self.callbacks.append(cb)
            """}
    table = tmp_path / "profile.txt"
    code = textwrap.dedent("""
        import types, torch
        from transformers.trainer import Trainer
        cb = Trainer().callbacks[0]
        for step in range(4):
            state = types.SimpleNamespace(global_step=step)
            cb.on_step_begin(None, state, None)
            torch.ones(64, 64) @ torch.ones(64, 64)
            state.global_step = step + 1
            cb.on_step_end(None, state, None)
    """)
    log = hook_run(tmp_path, code, {"GPU_CHECK_PROFILE": f"1:2:{table}"}, fake)
    assert {"hook": "profile", "written": str(table), "steps": [2, 3]}.items() <= next(
        e for e in log if e.get("written")).items()
    assert "steps 2-3" in table.read_text() and "aten::mm" in table.read_text()


def test_the_steady_window_leaves_the_warm_up_out(tmp_path):
    from steady import studio_steady, window

    # step, tokens so far, seconds so far: a slow first step, then 100 tokens/s
    points = [(1, 100, 5.0), (2, 200, 6.0), (3, 300, 7.0), (4, 400, 8.0), (5, 500, 9.5)]
    assert window(points, 1, 4)["tokens_per_s"] == pytest.approx(100.0)
    events = [{"type": "MetricsLogged", "step": s, "tokens_seen": n, "elapsed_s": t, "mfu": 0.1} for s, n, t in points]
    events.append({"type": "JobFinished", "tokens_per_s": 50.0, "mfu": 0.05})
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (tmp_path / "memory.json").write_text(json.dumps({"cuda_max_allocated_bytes": 5, "cuda_max_reserved_bytes": 7}))
    steady = studio_steady(tmp_path, 1, 4)
    assert steady["mfu"] == pytest.approx(0.05 * 100 / 50)  # the run's MFU per token at the steady rate
    assert (steady["cuda_max_allocated_bytes"], steady["cuda_max_reserved_bytes"]) == (5, 7)
    with pytest.raises(ValueError):
        window(points[:1], 1, 4)


def test_the_summary_says_what_did_not_run_and_invents_nothing(tmp_path):
    from gpu_summary import main

    (tmp_path / "env.json").write_text(json.dumps({"gpu": "NVIDIA H200", "torch": "2.11"}))
    (tmp_path / "steps.jsonl").write_text(json.dumps({"step": "build", "rc": 0, "seconds": 40}) + "\n")
    (tmp_path / "lora_1b.json").write_text(json.dumps({
        "ok": True, "estimate": {"total_bytes": 10 * 2**30}, "measured_allocated_over_predicted": 0.9,
        "measured_reserved_over_predicted": 1.0, "steady": {"cuda_max_allocated_bytes": 9 * 2**30,
                                                             "cuda_max_reserved_bytes": 10 * 2**30,
                                                             "tokens_per_s": 1234.0, "mfu": 0.3,
                                                             "from_step": 2, "to_step": 22}}))
    table = main(tmp_path)
    assert "| Llama-3.2-1B LoRA (12 GB preset) | predicted 10.00 GiB | max allocated 9.00 GiB (0.90x)" in table
    assert "1,234 useful tok/s over steps 3-22 | MFU 30.0%" in table
    assert "| Llama-3.1-8B QLoRA (16 GB preset) | did not run |" in table
    assert "| steady QLoRA 8B | did not run |" in table and "| export gguf | did not finish" in table
    assert table.splitlines()[1].startswith("|---")


def test_card_option_is_found_in_the_estimate_help_or_given():
    from gpu_maxlen import card_argument

    assert card_argument("  --max-seq-len  longest row\n  --card-gib GIB  the card") == "--card-gib {gib}"
    assert card_argument("  --json   print json") is None


def test_benches_switch_hub_kernels_off_before_transformers_loads():
    """The scripts switch at import, before any transformers import; the modules the test suite imports
    (estimate_measure) do not touch this process's environment, and from_pretrained gets use_kernels=False."""
    code = ("import sys, os; sys.path.insert(0, 'bench'); import estimate_measure; "
            "print(os.environ.get('USE_HUB_KERNELS')); import gpu_models, throughput_baseline; "
            "assert 'transformers' not in sys.modules; import hub_kernels; "
            "print(os.environ['USE_HUB_KERNELS'], os.environ['DISABLE_KERNEL_MAPPING'], hub_kernels.load_kwargs())")
    env = {k: v for k, v in os.environ.items() if k not in ("USE_HUB_KERNELS", "DISABLE_KERNEL_MAPPING")}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["None", "0", "1", "{'use_kernels':", "False}"]


def test_a_capped_run_is_judged_only_where_the_cap_was_applied(tmp_path):
    from gpu_maxlen import capped
    from gpu_summary import main

    log = tmp_path / "hook.log"
    log.write_text(json.dumps({"hook": "imported"}) + "\n" + json.dumps(
        {"hook": "memory_cap", "applied": False, "why": "no CUDA device"}) + "\n")
    assert capped(log) == {"hook": "memory_cap", "applied": False, "why": "no CUDA device"}
    assert capped(tmp_path / "missing.log") == {}
    cards = [{"gib": 24, "max_seq_len": 96, "within": None, "cap": capped(log)},
             {"gib": 80, "max_seq_len": 4096, "within": False, "cap": {"applied": True}, "error": "out of memory"}]
    (tmp_path / "maxlen.json").write_text(json.dumps({"cards": cards}))
    table = main(tmp_path)
    assert "| longest row, 24 GiB cap | seq_len 96 | not capped: no CUDA device |" in table
    assert "| longest row, 80 GiB cap | seq_len 4096 | NOT within the cap |" in table


def test_the_top_kernels_are_printed_only_where_mfu_is_under_a_quarter(tmp_path):
    from gpu_summary import profiles

    table = "steps 23-24, sorted by self_device_time_total\n---\nName\n---\n" + "\n".join(f"kernel_{i}" for i in range(30))
    for name, mfu in (("lora_1b", 0.31), ("qlora_8b", 0.12)):
        (tmp_path / f"{name}.json").write_text(json.dumps({"steady": {"mfu": mfu}}))
        (tmp_path / f"{name}_profile.txt").write_text(table)
    printed = profiles(tmp_path)
    assert "qlora_8b: MFU 12.0%" in printed and "lora_1b" not in printed
    assert "kernel_5" in printed and "kernel_20" not in printed  # the top rows only


def test_an_export_that_could_not_be_verified_is_not_called_failed():
    from gpu_summary import export_row

    not_verified = {"name": "perplexity", "outcome": "not verified", "passed": False, "verified": False,
                    "measured": "not verified: no reader"}
    tokenizer = {"name": "tokenizer", "outcome": "passed", "passed": True, "measured": "identical"}
    row = export_row("gguf", {"outcome": "not verified", "passed": False, "checks": [not_verified, tokenizer]}, {"rc": 0})
    assert row.startswith("| export gguf | WRITTEN, NOT VERIFIED, CLI exit 0 |")
    assert "perplexity not verified" in row and "tokenizer ok" in row and "FAILED" not in row
    failed = dict(not_verified, outcome="failed", verified=True)
    assert "| FAILED, CLI exit 1 |" in export_row("gguf", {"checks": [failed, tokenizer]}, {"rc": 1})


def test_the_vlm_presets_are_built_from_their_real_configs_with_the_tokenizers_image_ids(tmp_path):
    """GPU_CHECK_PARTS=vlm: each VLM preset's model is its Cost line's config.json (same parameters as the meta
    build of the fixture), its image tokens the tokenizer's ids; the script runs every one and the table names them."""
    import re

    import torch
    from transformers import AutoModelForImageTextToText

    from backend.api.presets import load_preset
    from backend.core.config.run_config import RunConfig
    from backend.core.registries.vision_families import VISION_FAMILIES
    from backend.estimate import estimate
    from gpu_summary import VLM_PRESETS, main
    from gpu_vlm_models import PRESETS, VLMS, cap_size, real_config
    from tests import model_configs, vision_models

    script = (BENCH / "gpu_check.sh").read_text()
    runs = re.findall(r"^  vlm_preset (\w+) (\S+\.yaml) (\w+) \d+$", script, re.M)
    assert {(preset, model) for _, preset, model in runs} == {(preset, name) for name, (_, _, preset) in VLMS.items()}
    assert {f"{name}.json" for name, _, _ in runs} == {file for _, file in VLM_PRESETS}
    for family, fixture, preset in VLMS.values():
        assert load_preset(PRESETS / preset).hub_id.replace("/", "--") == fixture
        tokenizer = vision_models.tiny_tokenizer(family)
        config = real_config(family, fixture, tokenizer)
        with torch.device("meta"):
            built = AutoModelForImageTextToText.from_config(config)
        assert model_configs.parameter_count(built) == model_configs.parameter_count(
            model_configs.meta_model(fixture, text_only=False))
        # the rows' image costs what the preset's Cost line counts: one image at the cap, its worst aspect
        run = RunConfig.load(PRESETS / preset)
        width, height = cap_size(family, PRESETS / preset, config)
        counted = estimate(model_configs.CONFIGS_DIR / fixture, run, device="cuda", images_per_row=1)
        assert VISION_FAMILIES[family].tokens_per_image(model_configs.load(fixture), width, height,
                                                        run.vision.max_pixels) == \
            counted.details["vision"]["image_tokens_per_row"]
        key = next(k for k in vision_models.FAMILY_TOKENS[family] if k.startswith("image_token"))
        token = tokenizer.convert_tokens_to_ids(vision_models.FAMILY_TOKENS[family][key])
        assert getattr(config, key) == token != model_configs.load(fixture)[key]
    table = main(tmp_path)  # no outputs: every VLM row says it did not run
    assert all(f"| {label} | did not run |" in table for label, _ in VLM_PRESETS)
