"""Pruning: the ranking, each kind of cut (layers, key/value head groups, FFN channels) on a trained run of
the bundled Llama and on random Qwen2 / Gemma 2 / Gemma 3 model folders, each reloaded by plain transformers
with the shapes its config.json records; perplexity before and after, the estimate recomputed, heal.yaml
trainable; the refusals, in one line, from the CLI.

One run is trained once per module in-process (5 steps, one thread); the prune jobs run in-process through
run_prune (the worker's job function), except two that go through the real CLI and worker.
"""

from __future__ import annotations

import io
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from backend.core.config.run_config import RunConfig
from backend.core.errors import JobError
from backend.core.protocol import JobKind
from backend.core.runs.run_folder import RunFolder
from backend.jobs.table import JOBS
from backend.runtime.reporter import Reporter
from backend.runtime.stop_listener import StopListener
from tests.conftest import BUNDLED_MODEL, PRESET, ROOT

torch.set_num_threads(1)
SMALL = ["data.max_examples=60", "train.micro_batch_size=8"]


def _job(kind: JobKind, config: RunConfig, folder: RunFolder, params: dict) -> list[dict]:
    stream = io.StringIO()
    reporter = Reporter(stream)
    reporter.attach_run(folder.path)
    try:
        JOBS[kind]()(config, folder.path, reporter, StopListener(io.StringIO()), params=params)
    finally:
        reporter.close()
    return [json.loads(line) for line in stream.getvalue().splitlines()]


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory) -> RunFolder:
    config = RunConfig.load(PRESET, ["train.max_steps=5", "train.cpu_threads=1", "name=prune-lora", *SMALL])
    folder = RunFolder.create(config, root=tmp_path_factory.mktemp("prune-runs"))
    _job("finetune", config, folder, {})
    assert (folder.adapter_dir / "adapter_model.safetensors").is_file()
    return folder


def prune(folder: RunFolder, out: Path, config: RunConfig | None = None, **params) -> tuple[list[dict], dict]:
    config = config or folder.load_config()
    events = _job("prune", config, folder, {"out": str(out), "limit": 8, **params})
    assert events[-1]["type"] == "JobFinished", events[-1]
    return events, json.loads((out / "prune_report.json").read_text())


def random_model(root: Path, family: str, layers: int = 6, kv_heads: int = 2) -> Path:
    """A random-weight model of `family` in bf16 with the bundled tokenizer (vocabulary 4096)."""
    from transformers import AutoModelForCausalLM, Gemma2Config, Gemma3TextConfig, Qwen2Config

    torch.manual_seed(0)
    common = dict(vocab_size=4096, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=512,
                  pad_token_id=0, bos_token_id=1, eos_token_id=2)
    config = {"qwen2": lambda: Qwen2Config(**common),
              "gemma2": lambda: Gemma2Config(**common, head_dim=16, sliding_window=16),
              "gemma3_text": lambda: Gemma3TextConfig(**common, head_dim=16, sliding_window=16)}[family]()
    folder = root / f"{family}-{layers}-{kv_heads}"
    AutoModelForCausalLM.from_config(config).to(torch.bfloat16).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy2(BUNDLED_MODEL / name, folder / name)
    return folder


def model_job(root: Path, model: Path) -> tuple[RunFolder, RunConfig]:
    """The run folder the CLI makes for a model folder: the demo data, the model as model.path."""
    config = RunConfig.from_dict({"name": f"prune-{model.name}", "model": {"path": str(model)},
                                  "data": {"path": "bundled:datasets/demo_train.jsonl", "max_examples": 60},
                                  "train": {"cpu_threads": 1, "micro_batch_size": 8}})
    return RunFolder.create(config, root=root), config


def reload(out: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)


def check_measured(report: dict) -> None:
    """Perplexity before and after, exact match, fewer parameters, a smaller estimate, heal.yaml."""
    ppl = report["perplexity"]
    assert ppl["tokens"] > 0
    assert all(math.isfinite(ppl[w]["perplexity"]) and ppl[w]["perplexity"] > 1 for w in ("before", "after"))
    assert report["exact_match"]["n"] == 8 and "accuracy" in report["exact_match"]["after"]
    assert report["parameters"]["after"] < report["parameters"]["before"]
    est = report["estimate"]
    assert 0 < est["after_bytes"] < est["before_bytes"], est
    heal = RunConfig.load(Path(report["path"]) / "heal.yaml")
    assert f"# Run it:   finetune-studio train {report['path']}/heal.yaml" in (Path(report["path"]) / "heal.yaml").read_text()
    assert Path(heal.model.path) == Path(report["path"]) and heal.model.adapter == ""


# --- ranking ---------------------------------------------------------------------------------------


def test_rank_only_scores_every_layer_group_and_channel(lora_run):
    events = _job("prune", lora_run.load_config(), lora_run, {"rank_only": True, "samples": 8})
    assert events[-1]["type"] == "JobFinished"
    ranking = json.loads((lora_run.path / "prune_ranking.json").read_text())
    assert sorted(ranking["layers"]["least_important_first"]) == [0, 1, 2, 3]
    scores = [s["score"] for s in ranking["layers"]["scores"]]
    assert all(0 <= s <= 2 for s in scores) and len(set(scores)) == 4
    assert [len(g) for g in ranking["heads"]["scores"]] == [2, 2, 2, 2]  # 2 key/value groups per layer
    assert ranking["ffn"]["intermediate_size"] == 768 and len(ranking["ffn"]["per_layer"]) == 4
    assert ranking["calibration"]["rows"] == 8 and ranking["calibration"]["tokens"] > 8
    assert not (lora_run.path / "pruned").exists()


def test_block_influence_ranks_an_identity_layer_least_important():
    """A layer whose attention and MLP write nothing leaves its input unchanged: score 0, ranked first."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from backend.pruning.importance import rank

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                                         num_attention_heads=4, num_key_value_heads=2)).eval()
    for proj in (model.model.layers[1].self_attn.o_proj, model.model.layers[1].mlp.down_proj):
        proj.weight.data.zero_()
    model.model.layers[2].self_attn.o_proj.weight.data[:, :16].zero_()  # heads 0 and 1 (head_dim 8): key/value group 0
    ranking = rank(model, [{"input_ids": list(range(3, 20))}, {"input_ids": list(range(5, 12))}], 0, 2)
    assert ranking.least_layers(1) == [1] and abs(ranking.layers[1]) < 1e-6
    assert ranking.least_groups(1)[2] == [0] and ranking.groups[2][0] == 0
    assert float(ranking.channels[1].abs().max()) == 0  # no down_proj columns: no channel matters


# --- each cut on a trained Llama run -----------------------------------------------------------------


def test_layer_drop_on_a_trained_run(lora_run, tmp_path):
    out = tmp_path / "layers"
    _, report = prune(lora_run, out, drop_layers=[1, 2], samples=8)
    model = reload(out)
    assert model.config.num_hidden_layers == 2 and len(model.model.layers) == 2
    assert report["removed"]["layers"] == [1, 2] and report["shapes"]["after"]["num_hidden_layers"] == 2
    kept, dropped = reload_merged_layer(lora_run, 3), reload_merged_layer(lora_run, 2)
    weight = model.model.layers[1].mlp.up_proj.weight.detach()
    # The old layer 3 moved up intact (one bf16 rounding step apart: peft merges in another order).
    torch.testing.assert_close(weight, kept, rtol=2**-7, atol=1e-4)
    assert (weight - dropped).abs().max() > 0.01
    check_measured(report)


def reload_merged_layer(run: RunFolder, index: int) -> torch.Tensor:
    """Layer `index`'s up_proj of the run merged by plain peft in fp32, rounded to bf16 as the pruned model is."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(BUNDLED_MODEL, dtype=torch.float32)
    merged = PeftModel.from_pretrained(base, run.adapter_dir).merge_and_unload()
    return merged.model.layers[index].mlp.up_proj.weight.to(torch.bfloat16).float()


def test_head_groups_on_a_trained_run(lora_run, tmp_path):
    out = tmp_path / "heads"
    _, report = prune(lora_run, out, drop_heads=1, samples=8)
    model = reload(out)
    attn = model.model.layers[0].self_attn
    assert (model.config.num_attention_heads, model.config.num_key_value_heads) == (2, 1)
    assert attn.q_proj.weight.shape == (128, 256) and attn.k_proj.weight.shape == (64, 256)
    assert attn.o_proj.weight.shape == (256, 128)
    assert len(report["removed"]["head_groups"]) == 4 and all(len(g) == 1 for g in report["removed"]["head_groups"])
    check_measured(report)


def test_ffn_channels_on_a_trained_run(lora_run, tmp_path):
    out = tmp_path / "ffn"
    _, report = prune(lora_run, out, ffn_keep=0.75, samples=8)
    model = reload(out)
    assert model.config.intermediate_size == 576
    mlp = model.model.layers[2].mlp
    assert mlp.gate_proj.weight.shape == (576, 256) and mlp.down_proj.weight.shape == (256, 576)
    check_measured(report)


def test_heal_config_trains_the_pruned_model(lora_run, tmp_path):
    out = tmp_path / "to-heal"
    prune(lora_run, out, layers=1, samples=8)
    heal = RunConfig.load(out / "heal.yaml", ["train.max_steps=2", "train.cpu_threads=1"])
    folder = RunFolder.create(heal, root=tmp_path / "heal-runs")
    events = _job("finetune", heal, folder, {})
    assert events[-1]["type"] == "JobFinished" and (folder.adapter_dir / "adapter_model.safetensors").is_file()


# --- other families, from model folders ---------------------------------------------------------------


@pytest.mark.parametrize("cut, expected", [({"drop_layers": [0, 3]}, (4, 2, 128)),
                                           ({"drop_heads": ["0:1", "1:0", "2:1", "3:1", "4:0", "5:0"]}, (6, 1, 128)),
                                           ({"ffn_keep": 0.5}, (6, 2, 64))], ids=["layers", "heads", "ffn"])
def test_qwen2_each_cut(tmp_path, cut, expected):
    model_dir = random_model(tmp_path, "qwen2")
    folder, config = model_job(tmp_path / "runs", model_dir)
    out = tmp_path / "out"
    _, report = prune(folder, out, config, model=str(model_dir), samples=4, **cut)
    model = reload(out)
    attn = model.model.layers[0].self_attn
    assert (model.config.num_hidden_layers, model.config.num_key_value_heads,
            model.config.intermediate_size) == expected
    assert attn.q_proj.bias.shape == (attn.q_proj.weight.shape[0],)  # Qwen2's q/k/v biases cut with their rows
    if "drop_heads" in cut:
        original = reload(model_dir).model.layers[0].self_attn
        assert torch.equal(attn.k_proj.weight, original.k_proj.weight[:16])  # layer 0 kept group 0
        assert torch.equal(attn.k_proj.bias, original.k_proj.bias[:16])
    check_measured(report)


@pytest.mark.parametrize("family", ["gemma3_text", "gemma2"])
def test_gemma_layer_drop_keeps_the_window_pattern(tmp_path, family):
    model_dir = random_model(tmp_path, family)
    before = json.loads((model_dir / "config.json").read_text())["layer_types"]
    folder, config = model_job(tmp_path / "runs", model_dir)
    out = tmp_path / "out"
    _, report = prune(folder, out, config, model=str(model_dir), samples=4, drop_layers=[1, 4])
    saved = json.loads((out / "config.json").read_text())
    assert saved["num_hidden_layers"] == 4
    assert saved["layer_types"] == [before[i] for i in (0, 2, 3, 5)]
    model = reload(out)
    assert [layer.self_attn.layer_idx for layer in model.model.layers] == [0, 1, 2, 3]
    assert list(model.config.layer_types) == saved["layer_types"]
    check_measured(report)


# --- refusals ---------------------------------------------------------------------------------------


def test_one_kv_head_refuses_head_pruning(tmp_path):
    model_dir = random_model(tmp_path, "qwen2", layers=2, kv_heads=1)
    folder, config = model_job(tmp_path / "runs", model_dir)
    with pytest.raises(JobError, match="1 key/value head"):
        _job("prune", config, folder, {"model": str(model_dir), "drop_heads": 1})
    assert not any(p.name.startswith(".") for p in folder.path.iterdir() if p.is_dir())


class LateStop:
    """A Stop that arrives on the `after`-th look: mid-job, once the scratch folder holds the merge."""

    def __init__(self, after: int) -> None:
        self.looks, self.after = 0, after

    @property
    def requested(self) -> bool:
        self.looks += 1
        return self.looks >= self.after


def test_a_stop_while_ranking_leaves_nothing_behind(lora_run, tmp_path):
    from backend.jobs.prune import run_prune

    out = tmp_path / "stopped"
    stop = LateStop(after=4)  # check, merge, rank, then the first calibration batch
    with pytest.raises(JobError, match="cancelled while measuring") as caught:
        run_prune(lora_run.load_config(), lora_run.path, Reporter(io.StringIO()), stop,
                  params={"out": str(out), "layers": 1, "samples": 16})
    assert caught.value.kind == "cancelled" and stop.looks == 4
    assert not out.exists() and list(tmp_path.glob(".stopped.partial-*")) == []


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "backend.cli", "prune", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_cli_refuses_bad_picks_in_one_line(lora_run):
    for args, says in [(["--drop-layers", "4"], "--drop-layers 4: out of range; this model has 4 layers"),
                       (["--drop-layers", "0,1,2,3"], "would leave none"),
                       (["--layers", "4"], "would leave none"),
                       (["--drop-heads", "0:1,1:1"], "the same number of key/value groups"),
                       (["--drop-heads", "2"], "drop at most 1 per layer"),
                       ([], "nothing to prune")]:
        done = _cli(str(lora_run.path), *args)
        assert done.returncode == 2, (args, done.stderr)
        assert says in done.stderr and "Traceback" not in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_cli_prunes_through_the_worker(lora_run, tmp_path):
    out = tmp_path / "cli"
    done = _cli(str(lora_run.path), "--layers", "1", "--samples", "8", "--limit", "4", "--out", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "layers:      4 -> 3" in done.stdout and "perplexity:" in done.stdout and "heal it:" in done.stdout
    assert "[rank]" in done.stderr and "Traceback" not in done.stderr
    again = _cli(str(lora_run.path), "--layers", "1", "--out", str(out))
    assert again.returncode == 2 and "--overwrite" in again.stderr


def test_a_preference_run_is_refused_before_anything_loads(tmp_path):
    from backend.jobs.prune import run_prune

    config = RunConfig.load(PRESET, ["technique.objective=dpo", "data.path=bundled:datasets/demo_dpo.jsonl"])
    folder = RunFolder.create(config, root=tmp_path)
    with pytest.raises(JobError, match="a dpo run's data are not prompt/answer rows") as caught:
        run_prune(config, folder.path, Reporter(io.StringIO()), StopListener(io.StringIO()), params={"layers": 1})
    assert "--format merged" in caught.value.hint


@pytest.mark.parametrize("family", ["qwen3", "mistral", "gemma", "llama"])
def test_every_cut_saves_and_reloads_computing_the_same(tmp_path, family):
    """The other supported families, in memory: all three cuts, saved, reloaded, the same logits."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from backend.pruning.importance import rank
    from backend.pruning.removal import drop_head_groups, drop_layers, keep_channels

    torch.manual_seed(0)
    config = AutoConfig.for_model(family, vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                                  num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    model = AutoModelForCausalLM.from_config(config).eval()
    ranking = rank(model, [{"input_ids": list(range(3, 30))}, {"input_ids": list(range(40, 52))}], 0, 2)
    drop_head_groups(model, ranking.least_groups(1))
    keep_channels(model, ranking.kept_channels(48))
    drop_layers(model, ranking.least_layers(2))
    ids = torch.arange(5, 25)[None]
    with torch.no_grad():
        expected = model(ids).logits
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    c = reloaded.config
    assert (c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.intermediate_size) == (2, 2, 1, 48)
    with torch.no_grad():
        assert torch.equal(reloaded(ids).logits, expected)


def test_the_figures_differ_by_the_pruning_alone(tmp_path):
    """The bundled model is fp32 and is written in bf16: a cut that keeps every channel changes no figure."""
    folder, config = model_job(tmp_path / "runs", BUNDLED_MODEL)
    _, report = prune(folder, tmp_path / "same", config, model=str(BUNDLED_MODEL), samples=4, ffn_keep=1.0)
    assert report["dtype"] == "bf16" and report["shapes"]["after"]["intermediate_size"] == 768
    assert report["perplexity"]["after"] == report["perplexity"]["before"]
    assert report["exact_match"]["after"] == report["exact_match"]["before"]
