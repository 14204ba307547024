"""The serving estimate: its KV cache per token against the cache transformers really returns, its
weights against transformers' parameter counts, vLLM's per-sequence rule, the solver, and the CLI.

`python -m tests.backend.test_serving_estimate` prints the measured-vs-formula table that
docs/benchmarks.md records.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from backend.estimate.families import read_dims
from backend.serving import Card, KVLayout, Sizing, estimate_serving, resolve
from backend.serving.weights import weight_bytes
from tests import families, model_configs
from tests.conftest import ROOT

KV_CASES = [("llama", 24), ("gemma2", 20), ("gemma2", 50), ("gemma3_text", 50), ("gpt2", 24), ("qwen3_moe", 24)]
"""(tiny family, tokens): GQA, sliding windows (window 32) below and above the window, learned
positions and MHA, and MoE (experts add weights, not KV)."""


def measured_cache(family: str, tokens: int) -> tuple[int, int, KVLayout]:
    """(bytes of the K/V tensors returned by a use_cache forward, the layout's prediction, the layout)."""
    import torch
    from transformers import AutoModelForCausalLM

    config = families.tiny_config(family)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    ids = torch.randint(3, families.VOCAB, (1, tokens))
    with torch.no_grad():
        cache = model(input_ids=ids, use_cache=True).cache
    held = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    _, dims, _ = read_dims(config.to_dict())
    layout = KVLayout.of(dims, value_bytes=4)  # the tiny models are fp32
    return held, layout.transformers_bytes(tokens), layout


@pytest.mark.parametrize(("family", "tokens"), KV_CASES)
def test_kv_cache_matches_what_transformers_holds(family, tokens):
    held, predicted, layout = measured_cache(family, tokens)
    assert held == predicted
    if not layout.sliding_layers or tokens < layout.window:
        assert held == tokens * layout.token_bytes  # 2 x layers x KV heads x head_dim x bytes, per token


def paged_cache(family: str, blocks: int = 64, page: int = 16) -> tuple[int, int, KVLayout]:
    """(bytes of the paged cache tensor transformers' continuous batching allocates for `blocks` pages of
    `page` tokens in every layer, less its two trash sectors; the same from the formula; the layout)."""
    import torch
    from transformers.generation.configuration_utils import ContinuousBatchingConfig
    from transformers.generation.continuous_batching.cache import PagedAttentionCache
    from transformers.generation.continuous_batching.distributed import DistributedHelper

    config = families.tiny_config(family)
    settings = ContinuousBatchingConfig(page_size=page, num_blocks=blocks, max_batch_tokens=64, max_memory_percent=0.5,
                                        max_blocks_per_request=8)
    cache = PagedAttentionCache(config, settings, "cpu", DistributedHelper(None, None), dtype=torch.float32)
    held = cache.cache_tensor.numel() * cache.cache_tensor.element_size() - 2 * cache.bytes_per_sector
    _, dims, _ = read_dims(config.to_dict())
    layout = KVLayout.of(dims, value_bytes=4)
    return held, blocks * page * layout.token_bytes, layout


@pytest.mark.parametrize("family", ["llama", "gemma2", "gpt2", "qwen3_moe"])
def test_a_servers_paged_cache_is_the_formula_per_block(family):
    """transformers' continuous-batching cache (what `transformers serve` batches with): a page of 16
    tokens in every layer costs 16 x the per-token figure, sliding layers included."""
    held, predicted, _ = paged_cache(family)
    assert held == predicted


def test_sliding_layers_keep_window_minus_one_tokens():
    held, _, layout = measured_cache("gemma2", 50)
    assert layout.sliding_layers == 1 and layout.full_layers == 1 and layout.window == 32
    assert held == (50 + 31) * layout.layer_token_bytes
    assert held < 50 * layout.token_bytes


def test_vllm_sequence_rule():
    """vLLM's KVCacheSpec.max_memory_usage_bytes: whole blocks (full layers); for a window, the last
    window - 1 tokens plus one batched chunk, plus one block (worked by hand)."""
    layout = KVLayout(full_layers=1, sliding_layers=1, window=32, kv_heads=2, head_dim=16, value_bytes=2)
    page = 16 * layout.layer_token_bytes
    assert layout.vllm_sequence_bytes(100, 16, 8) == 7 * page + (3 + 1) * page  # ceil(100/16); ceil(39/16)+1
    assert layout.vllm_sequence_bytes(20, 16, 2048) == 2 * page + (2 + 1) * page  # the window capped at the context
    assert KVLayout(2, 0, None, 2, 16).vllm_sequence_bytes(16, 16, 2048) == 2 * page


@pytest.mark.parametrize("name", ["meta-llama--Llama-3.2-1B-Instruct", "mistralai--Mixtral-8x7B-v0.1", "openai-community--gpt2"])
def test_16bit_weights_are_two_bytes_per_parameter_transformers_builds(name):
    arch, dims, _ = read_dims(model_configs.load(name))
    params = model_configs.parameter_count(model_configs.meta_model(name))
    assert weight_bytes(arch, dims, "merged").bytes == 2 * params  # Mixtral: the experts are counted
    for smaller, larger in [("gguf-q4_0", "gguf-q8_0"), ("bnb-4bit", "bnb-8bit"), ("gguf-q8_0", "merged")]:
        assert weight_bytes(arch, dims, smaller).bytes < weight_bytes(arch, dims, larger).bytes


def test_moe_adds_weights_not_kv():
    mixtral = model_configs.load("mistralai--Mixtral-8x7B-v0.1")
    dense = {**mixtral, "model_type": "mistral"}
    arch_m, dims_m, _ = read_dims(mixtral)
    arch_d, dims_d, _ = read_dims(dense)
    assert KVLayout.of(dims_m).token_bytes == KVLayout.of(dims_d).token_bytes == 2 * 32 * 8 * 128 * 2
    assert weight_bytes(arch_m, dims_m, "merged").bytes > 5 * weight_bytes(arch_d, dims_d, "merged").bytes


def _sizing(name: str, gb: float = 24, fmt: str = "merged") -> Sizing:
    arch, dims, _ = read_dims(model_configs.load(name))
    return Sizing(arch, dims, fmt, Card(gb), 131072)


def test_max_num_seqs_is_the_most_that_fit():
    sizing = _sizing("meta-llama--Llama-3.1-8B-Instruct")
    plan = sizing.seqs_at(4096)
    assert 0 < plan.max_num_seqs < 2048
    used = plan.weights + plan.runtime + plan.activations + plan.max_num_seqs * plan.kv_per_sequence
    assert used <= plan.budget == int(24 * 2**30 * 0.9)  # --card-gb in GiB, as the card reports its total
    one_more = sizing.seqs_at(4096).max_num_seqs + 1
    assert one_more * sizing.sequence_bytes(4096) > sizing._spare(one_more)
    longer = sizing.context_at(plan.max_num_seqs)
    assert longer.context >= 4096 and sizing.context_at(plan.max_num_seqs * 2).context < 4096


def test_a_smaller_format_serves_more():
    merged = _sizing("meta-llama--Llama-3.1-8B-Instruct").seqs_at(8192).max_num_seqs
    q4 = _sizing("meta-llama--Llama-3.1-8B-Instruct", fmt="gguf-q4_0").seqs_at(8192).max_num_seqs
    assert q4 > merged
    assert _sizing("meta-llama--Llama-3.3-70B-Instruct").does_not_fit().startswith("the weights")


def test_the_profile_run_grows_with_the_sampler_rows_up_to_the_batched_tokens():
    from backend.serving.sizing import activation_bytes

    arch, dims, _ = read_dims(model_configs.load("meta-llama--Llama-3.1-8B-Instruct"))
    card = Card(24)
    one, many = activation_bytes(arch, dims, card, 1), activation_bytes(arch, dims, card, 101)
    assert many - one == 100 * 128256 * 14  # 16-bit logits + fp32 copy, probabilities, log-probabilities
    assert activation_bytes(arch, dims, card, 5000) == activation_bytes(arch, dims, card, card.batched_tokens)
    # Llama's MLP (gate, up, activation output: 3 x 14336) is the larger half of a layer over 2048 tokens.
    assert one == 2048 * 2 * (2 * 4096 + 3 * 14336) + 128256 * 14


def test_tensor_parallel_must_divide_the_heads():
    arch, dims, _ = read_dims(model_configs.load("meta-llama--Llama-3.1-8B-Instruct"))
    with pytest.raises(ValueError, match="--tensor-parallel 3"):
        Sizing(arch, dims, "merged", Card(24, tensor_parallel=3), 8192)
    two = Sizing(arch, dims, "merged", Card(24, tensor_parallel=2), 8192)
    assert two.kv.token_bytes * 2 == KVLayout.of(dims).token_bytes


def _fixture(name: str) -> str:
    return str(model_configs.CONFIGS_DIR / name)


def test_the_vllm_line_carries_the_numbers():
    result = estimate_serving(resolve(_fixture("google--gemma-2-2b-it"), None), Card(24), 4096, 8)
    first, second = result["plans"]
    assert f"--max-model-len 4096 --max-num-seqs {first['max_num_seqs']} --gpu-memory-utilization 0.9" in first["vllm"]
    assert "--block-size 16" in first["vllm"] and "--tensor-parallel-size 1" in first["vllm"]
    assert f"--max-model-len {second['context']} --max-num-seqs 8 " in second["vllm"]
    assert result["kv_per_token_bytes"] == 2 * 26 * 4 * 256 * 2


def _cli(*args: str) -> subprocess.CompletedProcess:
    code = ("import sys; from backend.cli.app import main; rc = main(sys.argv[1:]);"
            "assert 'torch' not in sys.modules, 'serve-estimate imported torch'; sys.exit(rc)")
    return subprocess.run([sys.executable, "-c", code, "serve-estimate", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


def test_cli_prints_the_line_without_torch():
    done = _cli(_fixture("Qwen--Qwen3-8B"), "--card-gb", "24", "--concurrency", "4")
    assert done.returncode == 0, done.stderr
    assert "max_num_seqs" in done.stdout and done.stdout.count("vllm serve ") == 2
    big = _cli(_fixture("meta-llama--Llama-3.3-70B-Instruct"), "--card-gb", "24", "--json")
    assert big.returncode == 1 and json.loads(big.stdout)["does_not_fit"].startswith("the weights")


def test_cli_errors_are_one_line(tmp_path, capsys):
    from backend.cli.app import main

    assert main(["serve-estimate", str(tmp_path / "nothing"), "--card-gb", "24"]) == 2
    assert "no such folder" in capsys.readouterr().err
    assert main(["serve-estimate", str(tmp_path), "--card-gb", "24"]) == 2
    assert "no config.json" in capsys.readouterr().err
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 2}))
    assert main(["serve-estimate", str(tmp_path), "--card-gb", "24"]) == 2
    err = capsys.readouterr().err
    assert "hidden_size is missing" in err and len(err.strip().splitlines()) <= 2
    assert main(["serve-estimate", _fixture("openai-community--gpt2"), "--card-gb", "24", "--context", "4096"]) == 2
    assert "at most 1,024 tokens" in capsys.readouterr().err
    assert main(["serve-estimate", _fixture("openai-community--gpt2"), "--card-gb", "0"]) == 2


def _run_folder(tmp_path, adapter_params: int = 0):
    from backend.core.config.run_config import RunConfig
    from backend.core.runs.run_folder import RunFolder

    config = RunConfig(name="serve", model={"path": _fixture("meta-llama--Llama-3.2-1B-Instruct")})
    folder = RunFolder.create(config, root=tmp_path)
    if adapter_params:
        import numpy as np
        from safetensors.numpy import save_file

        (folder.path / "adapter").mkdir()
        save_file({"a": np.zeros((8, adapter_params // 8), np.float32)},
                  str(folder.path / "adapter" / "adapter_model.safetensors"))
    return folder


def test_a_run_without_export_is_its_base_with_the_adapter(tmp_path, capsys):
    from backend.cli.app import main

    folder = _run_folder(tmp_path, adapter_params=8 * 1024)
    assert main(["serve-estimate", str(folder.path), "--card-gb", "24", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["format"] == "merged" and data["model"].endswith("meta-llama--Llama-3.2-1B-Instruct")
    assert f"--lora-modules {folder.path.name}={folder.path / 'adapter'} --max-lora-rank 8" in data["plans"][0]["vllm"]
    arch, dims, _ = read_dims(model_configs.load("meta-llama--Llama-3.2-1B-Instruct"))
    per_rank = 16 * (2 * (2048 + 2048) + 2 * (2048 + 512) + 3 * (2048 + 8192))  # per layer: q o, k v, gate up down
    assert data["plans"][0]["weights"] == weight_bytes(arch, dims, "merged").bytes + 2 * 8 * per_rank
    assert "(8,192 parameters) in a LoRA slot of rank 8" in data["notes"][0]


def test_lora_ranks_vllm_takes():
    from backend.serving.source import lora_slot

    assert [lora_slot(r) for r in (1, 4, 8, 9, 300, 512)] == [1, 8, 8, 16, 320, 512]
    with pytest.raises(ValueError, match="up to 512"):
        lora_slot(1024)


def test_a_run_uses_its_export(tmp_path, capsys):
    from backend.cli.app import main

    folder = _run_folder(tmp_path)
    gguf = folder.path / "exports" / "gguf-q4_0"
    gguf.mkdir(parents=True)
    (gguf / "export_report.json").write_text(json.dumps(
        {"format": "gguf-q4_0", "base_model": _fixture("meta-llama--Llama-3.2-1B-Instruct")}))
    assert main(["serve-estimate", str(folder.path), "--card-gb", "8", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["format"] == "gguf-q4_0" and data["model"] == str(gguf / "model.gguf")
    assert data["plans"][0]["vllm"].endswith(f"--tokenizer {_fixture('meta-llama--Llama-3.2-1B-Instruct')}")
    assert main(["serve-estimate", str(gguf), "--card-gb", "8", "--format", "merged"]) == 2
    assert "is a gguf-q4_0 export" in capsys.readouterr().err
    assert main(["serve-estimate", str(folder.path), "--card-gb", "8", "--format", "bnb-4bit", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert "not exported yet" in data["notes"][0] and "--quantization bitsandbytes" in data["plans"][0]["vllm"]


def main() -> None:
    """The measured-vs-formula table for docs/benchmarks.md."""
    print("| family | tokens | window | cache measured (B) | formula (B) | tokens x per-token (B) |")
    print("|---|---|---|---|---|---|")
    for family, tokens in KV_CASES:
        held, predicted, layout = measured_cache(family, tokens)
        print(f"| {family} | {tokens} | {layout.window or '-'} | {held:,} | {predicted:,} | "
              f"{tokens * layout.token_bytes:,} |")
    print("\n| family | paged cache, 64 blocks of 16 tokens (B, trash sectors excluded) | formula (B) |")
    print("|---|---|---|")
    for family in ("llama", "gemma2", "gpt2", "qwen3_moe"):
        held, predicted, _ = paged_cache(family)
        print(f"| {family} | {held:,} | {predicted:,} |")


if __name__ == "__main__":
    main()
