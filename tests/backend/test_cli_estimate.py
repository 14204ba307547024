"""`finetune-studio estimate` prints a table or the JSON contract, without importing torch."""

import json
import subprocess
import sys

from tests.conftest import PRESET, ROOT

PARTS = {"weights", "adapters", "gradients", "optimizer", "master_weights", "activations", "logits", "runtime"}


def run(*args: str) -> subprocess.CompletedProcess:
    code = ("import sys, runpy; sys.argv = ['finetune-studio', *sys.argv[1:]];"
            "from backend.cli import main; rc = main(sys.argv[1:]);"
            "assert 'torch' not in sys.modules, 'estimate imported torch'; sys.exit(rc)")
    return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_json_contract_on_cpu():
    done = run("estimate", str(PRESET), "--json", "--device", "cpu", "--set", "train.micro_batch_size=2")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert set(data["breakdown"]) == PARTS
    assert data["sum_of_parts_bytes"] == sum(data["breakdown"].values()) >= data["total_bytes"] > 0
    assert data["breakdown"]["runtime"] == 0


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
    from backend.config import RunConfig
    from backend.estimate import estimate
    from backend.training.dataset_profile import DatasetProfile

    measured = json.loads(run("estimate", str(PRESET), "--json", "--device", "cpu").stdout)
    worst = json.loads(run("estimate", str(PRESET), "--json", "--device", "cpu", "--worst-case").stdout)
    config = RunConfig.load(PRESET)
    answer = DatasetProfile.read(config.data.path, config.model.path).longest_answer()
    assert answer is not None
    studio = estimate(config.resolved_model_path(), config, device="cpu", target_tokens=answer)
    assert measured["breakdown"]["logits"] == studio.logits < worst["breakdown"]["logits"]
    assert "longest answer, " in run("estimate", str(PRESET), "--device", "cpu").stdout
