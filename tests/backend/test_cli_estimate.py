"""`finetune-studio estimate` prints a table or the JSON contract, without importing torch."""

import json
import subprocess
import sys

from tests.conftest import PRESET, ROOT

PARTS = {"weights", "adapters", "gradients", "optimizer", "master_weights", "activations", "logits", "runtime"}


def run(*args: str) -> subprocess.CompletedProcess:
    code = ("import sys, runpy; sys.argv = ['finetune-studio', *sys.argv[1:]];"
            "from backend.cli.app import main; rc = main(sys.argv[1:]);"
            "assert 'torch' not in sys.modules, 'estimate imported torch'; sys.exit(rc)")
    return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_json_contract_on_cpu():
    done = run("estimate", str(PRESET), "--json", "--device", "cpu", "--set", "train.micro_batch_size=2")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert set(data["breakdown"]) == PARTS
    assert data["sum_of_parts_bytes"] == sum(data["breakdown"].values()) >= data["total_bytes"] > 0
    from backend.estimate.calibration import DEFAULT_BASELINE_BYTES

    # A fresh studio home has no runs: the CPU runtime is the stated default process baseline.
    assert data["breakdown"]["runtime"] == DEFAULT_BASELINE_BYTES and "not calibrated yet" in data["calibration"]
    assert data["device"] == "cpu" and data["device_source"].startswith("from --device")
    assert data["start_blocker"] == "" and data["verdicts"] == []


def test_table_for_a_config_only_folder(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192,
        "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64,
        "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16"}))
    done = run("estimate", str(PRESET), "--set", f"model.path={tmp_path}", "--set", "technique.method=qlora")
    assert done.returncode == 0, done.stderr
    assert "weights" in done.stdout and "GiB" in done.stdout and "total" in done.stdout
    assert "logits counted at every position" in done.stdout  # no tokenizer.json: the data is not measured


def test_logits_follow_the_data_as_in_the_studio():
    """The CLI reads the data like the Data page: the same longest answer, the same estimate."""
    from backend.core.config.run_config import RunConfig
    from backend.estimate import estimate
    from backend.core.data.dataset_profile import DatasetProfile

    measured = json.loads(run("estimate", str(PRESET), "--json", "--device", "cpu").stdout)
    worst = json.loads(run("estimate", str(PRESET), "--json", "--device", "cpu", "--worst-case").stdout)
    config = RunConfig.load(PRESET)
    answer = DatasetProfile.read(config.data.path, config.model.path).longest_answer()
    assert answer is not None
    studio = estimate(config.resolved_model_path(), config, device="cpu", target_tokens=answer)
    assert measured["breakdown"]["logits"] == studio.logits < worst["breakdown"]["logits"]
    assert "longest answer, " in run("estimate", str(PRESET), "--device", "cpu").stdout


def test_the_device_defaults_to_this_machines_and_is_said():
    from backend.core.device_caps import detected_device

    here = detected_device()
    done = run("estimate", str(PRESET))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"device: {here.kind} (assumed, this machine's: {here.why}")
    assert json.loads(run("estimate", str(PRESET), "--json").stdout)["device"] == here.kind


def test_nvml_decides_the_device_without_torch():
    from backend.core.device_caps import detected_device
    from tests.fakes.fake_nvml import fake_pynvml

    gpu = fake_pynvml()
    gpu.nvmlDeviceGetCudaComputeCapability = lambda handle: (9, 0)
    found = detected_device(gpu)
    assert found.kind == "cuda" and found.bf16 is True and found.devices[0].name == "NVIDIA Fake H100"
    assert "NVIDIA Fake H100" in found.why
    none = detected_device(fake_pynvml(fail_init=True))
    assert none.kind == "cpu" and "Driver Not Loaded" in none.why
    empty = fake_pynvml()
    empty.nvmlDeviceGetCount = lambda: 0
    assert detected_device(empty).kind == "cpu"


def test_what_cannot_run_here_is_said_and_not_counted():
    done = run("estimate", str(PRESET), "--device", "cpu", "--set", "technique.liger_kernel=true",
               "--set", "technique.optimizer=paged_adamw_8bit")
    assert done.returncode == 0, done.stderr
    assert "cannot run here: technique.liger_kernel: Liger's fused kernels" in done.stdout
    assert "runs as adamw_8bit: technique.optimizer: paged_adamw_8bit -> adamw_8bit" in done.stdout
    ticked = json.loads(run("estimate", str(PRESET), "--json", "--device", "cpu",
                            "--set", "technique.liger_kernel=true").stdout)
    plain = json.loads(run("estimate", str(PRESET), "--json", "--device", "cpu").stdout)
    assert ticked["total_bytes"] == plain["total_bytes"]  # Liger's saving is not counted where it cannot run
    assert ticked["start_blocker"].startswith("technique.liger_kernel:")


def _config_only(tmp_path, folder: str) -> str:
    (tmp_path / "config.json").write_text((ROOT / "tests" / "fixtures" / "model_configs" / folder / "config.json").read_text())
    return f"model.path={tmp_path}"


def test_the_table_says_which_cards_the_run_fits(tmp_path):
    done = run("estimate", str(ROOT / "resources" / "presets" / "llama-3.2-1b_lora_12gb.yaml"), "--worst-case",
               "--set", _config_only(tmp_path, "meta-llama--Llama-3.2-1B-Instruct"),
               "--set", "train.micro_batch_size=16")  # 16 rows of 2048 tokens: more than an 8 GB card holds
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if x.startswith("on CUDA: fits "))
    assert "; not 8" in line and "141" in line


def test_max_seq_len_on_a_card_one_line_and_json(tmp_path):
    args = ("estimate", str(ROOT / "resources" / "presets" / "llama-3.1-8b_qlora_16gb.yaml"), "--worst-case",
            "--set", _config_only(tmp_path, "meta-llama--Llama-3.1-8B-Instruct"), "--max-seq-len", "--card-gb", "24")
    done = run(*args)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("longest seq_len that fits a 24 GB card") and "tokens" in lines[0]
    data = json.loads(run(*args, "--json").stdout)
    assert data["max_seq_len"] > 2048 and f"{data['max_seq_len']:,} tokens" in lines[0]
    assert data["max_seq_len_capped"] is False and data["cards"]["not"][:2] == [8, 12]


def test_max_seq_len_for_cuda_without_a_gpu_or_card_is_one_line(tmp_path):
    done = run("estimate", str(PRESET), "--worst-case", "--max-seq-len", "--device", "cuda")
    assert done.returncode != 0 and "--card-gb" in done.stderr and "Traceback" not in done.stderr
