"""Serving the calibrated exports (gptq-int4, awq-int4, w8a8): recognised, launched per engine, sized from
their files, and one served for real by `transformers serve` on the CPU.

One run of the bundled model is trained in-process (3 steps) and exported to all three formats on 8
calibration rows, as tests/backend/test_export_calibrated.py does.
"""

from __future__ import annotations

import json
import shutil
import signal
import time
from pathlib import Path

import pytest

from backend.core.registries.export_formats import CALIBRATED
from backend.core.registries.serving_options import SERVED_FORMATS
from backend.cli.app import main
from backend.estimate.families import read_dims
from backend.serving import Card, engines, estimate_serving, resolve
from backend.serving.calibrated import predicted
from backend.serving.engines import choose_engine, transformers_launch, vllm_launch
from backend.serving.source import ORDER
from tests import model_configs

TOKEN = "fs-test-token"
SHORT = ("train.max_steps=3", "train.seq_len=64", "data.max_examples=40")


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A trained run of the bundled model with its gptq-int4, awq-int4 and w8a8 exports."""
    import torch

    from tests.backend.test_export import _train, export

    torch.set_num_threads(1)
    folder = _train(tmp_path_factory.mktemp("serve-calibrated"), "serve-cal", *SHORT)
    for fmt in CALIBRATED:
        _, report = export(folder, fmt, calibration_samples=8)
        assert report["outcome"] == "passed", report
    return folder.path


def test_the_calibrated_formats_are_served_after_merged_and_before_bitsandbytes():
    assert ORDER == SERVED_FORMATS and set(CALIBRATED) <= set(SERVED_FORMATS)
    assert ORDER.index("merged") < min(map(ORDER.index, CALIBRATED)) and ORDER.index("w8a8") < ORDER.index("gptq-int4")
    assert max(map(ORDER.index, CALIBRATED)) < ORDER.index("bnb-8bit")


def test_a_run_serves_its_calibrated_export_first_when_it_has_no_merged_one(run):
    assert resolve(str(run), None).serve_path == str(run / "exports" / "w8a8")
    assert resolve(str(run), "gptq-int4").serve_path == str(run / "exports" / "gptq-int4")


def test_a_run_without_the_calibrated_export_names_the_command_that_makes_it(tmp_path, capsys):
    from backend.core.runs.run_folder import RunFolder
    from backend.core.config.run_config import RunConfig
    from tests.conftest import PRESET

    folder = RunFolder.create(RunConfig.load(PRESET, ["name=no-export"]), root=tmp_path)
    assert main(["serve", str(folder.path), "--format", "awq-int4", "--port", "0", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert f"make it first with `finetune-studio export {folder.path} --format awq-int4`" in err and "\n" not in err
    assert main(["serve-estimate", str(folder.path), "--format", "awq-int4", "--card-gb", "24", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["weights_how"].startswith("predicted from config.json: int4") and "not exported yet" in data["notes"][0]


@pytest.mark.parametrize("fmt", CALIBRATED)
def test_each_calibrated_export_goes_to_transformers_or_vllm_never_llama_cpp(run, fmt, monkeypatch):
    export = run / "exports" / fmt
    source = resolve(str(export), None)
    assert source.fmt == fmt and source.serve_path == str(export) and source.flags == []
    assert source.weight_files is not None
    monkeypatch.setattr(engines, "installed", lambda module: module != "vllm")
    assert choose_engine(source, "auto", "cpu") == choose_engine(source, "auto", "cuda") == "transformers"
    with pytest.raises(ValueError, match=rf"--engine llama-cpp serves a GGUF export; .* is {fmt} ") as refused:
        choose_engine(source, "llama-cpp", "cpu")
    assert "\n" not in str(refused.value)
    monkeypatch.setattr(engines, "installed", lambda module: True)
    assert choose_engine(source, "auto", "cuda") == "vllm" and choose_engine(source, "auto", "cpu") == "transformers"
    cpu = transformers_launch(source, 8131, TOKEN, "cpu")
    assert cpu.argv[4] == str(export) and "--continuous-batching" in cpu.argv and _flag(cpu.argv, "--device") == "cpu"
    assert _flag(cpu.argv, "--cb-num-blocks") == "32" and cpu.model == str(export)
    assert any(f"transformers unpacks the {fmt} integers to 16-bit" in note for note in cpu.notes)
    assert ("rounds every linear layer's input to int8" in " ".join(cpu.notes)) == (fmt == "w8a8")
    gpu = transformers_launch(source, 8131, TOKEN, "cuda", context=512, seqs=4)
    assert _flag(gpu.argv, "--device") == "cuda" and _flag(gpu.argv, "--cb-num-blocks") == "8"
    vllm = vllm_launch(source, 8132, TOKEN, Card(24.0), context=512)
    assert vllm.argv[1:3] == ["serve", str(export)] and vllm.env["VLLM_API_KEY"] == TOKEN
    assert "--quantization" not in vllm.argv  # vLLM reads compressed-tensors from config.json
    assert _flag(vllm.argv, "--max-model-len") == "512" and int(_flag(vllm.argv, "--max-num-seqs")) > 1


def test_without_compressed_tensors_transformers_is_refused_in_one_line(run, monkeypatch):
    source = resolve(str(run / "exports" / "gptq-int4"), None)
    monkeypatch.setattr(engines, "installed", lambda module: module != "compressed_tensors")
    with pytest.raises(ValueError, match=r"compressed-tensors package is not installed.*--format merged"):
        choose_engine(source, "auto", "cpu")


def test_a_model_folder_holding_compressed_tensors_is_recognised_from_config_json(run, tmp_path, capsys):
    folder = tmp_path / "copied"
    shutil.copytree(run / "exports" / "gptq-int4", folder)
    (folder / "export_report.json").unlink()
    source = resolve(str(folder), None)
    assert source.fmt == "gptq-int4" and source.weight_files is not None and not source.notes
    with pytest.raises(ValueError, match="holds compressed-tensors gptq-int4 weights"):  # awq-int4's groups are asymmetric
        resolve(str(folder), "awq-int4")
    asymmetric = tmp_path / "copied-awq"
    shutil.copytree(run / "exports" / "awq-int4", asymmetric)
    (asymmetric / "export_report.json").unlink()
    assert resolve(str(asymmetric), None).fmt == "awq-int4"
    assert main(["serve-estimate", str(folder), "--card-gb", "24", "--format", "merged"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--format merged" in err and "compressed-tensors gptq-int4 weights" in err and "\n" not in err
    config = json.loads((folder / "config.json").read_text())
    del config["quantization_config"]
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "export_report.json").write_text(json.dumps({"format": "gptq-int4"}))
    with pytest.raises(ValueError, match="no compressed-tensors quantization_config of a gptq-int4 export"):
        resolve(str(folder), None)


# --- the serving estimate -------------------------------------------------------------------------

def _file_tensors(folder: Path) -> dict[str, int]:
    """Bytes per dtype of every tensor in the folder's safetensors files, read with safetensors itself."""
    from safetensors import safe_open

    held: dict[str, int] = {}
    for path in folder.glob("*.safetensors"):
        with safe_open(path, "pt") as handle:
            for name in handle.keys():
                tensor = handle.get_tensor(name)
                key = str(tensor.dtype).removeprefix("torch.")
                held[key] = held.get(key, 0) + tensor.numel() * tensor.element_size()
    return held


@pytest.mark.parametrize("fmt", ["gptq-int4", "awq-int4", "w8a8"])
def test_the_estimates_weights_are_the_files_tensors_and_the_prediction_matches(run, fmt, bundled_model):
    export = run / "exports" / fmt
    held = _file_tensors(export)
    result = estimate_serving(resolve(str(export), None), Card(24), 512, None)
    assert result["plans"][0]["weights"] == sum(held.values())
    arch, dims, _ = read_dims(json.loads((bundled_model / "config.json").read_text()))
    linear = 4 * (2 * 256 * 256 + 2 * 256 * 128 + 3 * 256 * 768)  # 4 layers: q o, k v, gate up down
    rows = 4 * (256 + 256 + 128 + 128 + 768 + 768 + 256)  # output rows of q o k v gate up down
    sixteen_bit = 2 * (4096 * 256 + 9 * 256)  # the tied embedding, 2 norms a layer + the final norm
    if fmt == "w8a8":
        assert held == {"int8": linear, "bfloat16": sixteen_bit + 2 * rows}
    else:  # 8 int4 to an int32, a bf16 scale per group of 128 inputs, an int64[2] shape per layer
        groups = 4 * (2 * 256 * 2 + 2 * 128 * 2 + 2 * 768 * 2 + 256 * 6)
        zeros = groups // 2 if fmt == "awq-int4" else 0  # awq-int4: a 4-bit zero point per group, 8 to an int32
        assert held == {"int32": linear // 2 + zeros, "bfloat16": sixteen_bit + 2 * groups, "int64": 28 * 16}
    assert predicted(arch, dims, fmt)[0] == sum(held.values())  # before the export exists, the same bytes
    halved = estimate_serving(resolve(str(export), None), Card(24, tensor_parallel=2), 512, None)
    assert halved["plans"][0]["weights"] == -(-sum(held.values()) // 2)


def test_serve_estimate_prints_a_calibrated_exports_files_and_a_plain_vllm_line(run, capsys):
    export = run / "exports" / "gptq-int4"
    assert main(["serve-estimate", str(export), "--card-gb", "24", "--context", "512"]) == 0
    out = capsys.readouterr().out
    size = sum(_file_tensors(export).values()) / 2**20
    assert f"weights:     {size:.2f} MiB (as model.safetensors holds them: int4 packed 8 to an int32" in out
    assert "per group of 128" in out and f"vllm serve {export} --max-model-len 512" in out
    assert "--quantization" not in out
    assert main(["serve-estimate", str(run), "--card-gb", "24", "--format", "awq-int4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["model"] == str(run / "exports" / "awq-int4")


def test_predicted_calibrated_weights_for_real_configs():
    arch, dims, _ = read_dims(model_configs.load("meta-llama--Llama-3.1-8B-Instruct"))
    merged = estimate_serving(resolve(str(model_configs.CONFIGS_DIR / "meta-llama--Llama-3.1-8B-Instruct"), "merged"),
                              Card(24), 8192, None)["plans"][0]
    int4, how = predicted(arch, dims, "gptq-int4")
    int8, _ = predicted(arch, dims, "w8a8")
    assert int4 < int8 < merged["weights"] and "per group of 128" in how
    # 6.98 B linear weights at 0.5 B + 1/64 B, 1.05 B other parameters (embeddings, lm_head) at 2 B
    assert 5.3e9 < int4 < 5.9e9
    for name, why in (("openai-community--gpt2", "Conv1D"), ("mistralai--Mixtral-8x7B-v0.1", "experts")):
        arch, dims, _ = read_dims(model_configs.load(name))
        with pytest.raises(ValueError, match=why):
            predicted(arch, dims, "awq-int4")


# --- served for real --------------------------------------------------------------------------------

def test_transformers_serves_a_gptq_export_on_the_cpu_to_an_openai_client(run):
    from openai import OpenAI

    from tests.backend.test_serve import start_cli

    export = run / "exports" / "gptq-int4"
    served = start_cli(export)
    try:
        assert served["model"] == str(export) and "engine:  transformers" in served["lines"]
        client = OpenAI(base_url=f"http://127.0.0.1:{served['port']}/v1", api_key=served["token"], timeout=60)
        reply = client.chat.completions.create(model=served["model"], max_tokens=8,
                                               messages=[{"role": "user", "content": "Count to 3"}])
        assert reply.choices[0].message.content and 0 < reply.usage.completion_tokens <= 8
        # compressed-tensors unpacked the file's integers: its progress line, relayed from the server
        deadline = time.monotonic() + 10
        while not any("Decompressing model" in line for line in served["lines"]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert any("Decompressing model" in line for line in served["lines"]), served["lines"][-10:]
    finally:
        served["process"].send_signal(signal.SIGINT)
        assert served["process"].wait(60) == 0
