"""No model load asks for Hub kernels: train, export with its check, eval and chat, and TRL's reference copy.

On the CPU transformers fetches nothing, so a load that forgot `use_kernels=False` would only fail on a
GPU machine; here every `from_pretrained` of a model is recorded with USE_HUB_KERNELS unset, and each must
have said no itself.
"""

from __future__ import annotations

import io

import pytest
import torch

from backend.core.config.run_config import RunConfig
from backend.runtime.hub_kernels import LOAD_KWARGS, OFF_ENV
from backend.runtime.processes import worker_env
from backend.runtime.reporter import Reporter
from backend.runtime.stop_listener import StopListener
from tests.backend.objective_runs import CPU, evaluate_run, run_preset
from tests.conftest import PRESET, ROOT

torch.set_num_threads(1)


@pytest.fixture
def loads(monkeypatch) -> list[tuple[str, object]]:
    """Every model `from_pretrained` in this test: (class name, the use_kernels it was given)."""
    from transformers import PreTrainedModel

    for name in OFF_ENV:
        monkeypatch.delenv(name, raising=False)
    seen: list[tuple[str, object]] = []
    original = PreTrainedModel.from_pretrained.__func__

    def spy(cls, *args, **kwargs):
        seen.append((cls.__name__, kwargs.get("use_kernels", "not given")))
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(PreTrainedModel, "from_pretrained", classmethod(spy))
    return seen


def _asked(seen: list[tuple[str, object]]) -> list[tuple[str, object]]:
    return [(name, value) for name, value in seen if value is not False]


def test_the_worker_environment_switches_hub_kernels_off_whatever_the_caller_set():
    env = worker_env({"USE_HUB_KERNELS": "1", "PATH": "/usr/bin"})
    assert env["USE_HUB_KERNELS"] == "0" and env["DISABLE_KERNEL_MAPPING"] == "1"
    assert LOAD_KWARGS == {"use_kernels": False}


def test_the_worker_sets_the_switches_before_transformers_is_imported():
    source = (ROOT / "backend" / "worker" / "__main__.py").read_text()
    assert source.index("os.environ.update(worker_env())") < source.index("from backend.worker.runner import")


def test_train_export_eval_and_chat_load_every_model_without_hub_kernels(tmp_path, loads):
    from backend.jobs.chat import run_chat
    from backend.jobs.export import run_export

    events = run_preset(tmp_path, PRESET, ["train.max_steps=2", "train.cpu_threads=1", "data.max_examples=40",
                                           "train.seq_len=64", "train.eval_steps=0"])
    assert events[-1].type == "JobFinished", events[-1]
    run_dir = tmp_path / "run"
    config = RunConfig.load(run_dir / "config.yaml")
    trained = len(loads)
    for fmt in ("merged", "gguf-f16"):
        run_export(config, run_dir, Reporter(io.StringIO()), StopListener(io.StringIO()), capabilities=CPU,
                   params={"format": fmt, "dtype": "fp16"} if fmt == "merged" else {"format": fmt})
    exported = len(loads)
    evaluate_run(run_dir, {"limit": 4})
    evaluated = len(loads)
    run_chat(config, run_dir, Reporter(io.StringIO()), StopListener(io.StringIO()), capabilities=CPU,
             params={"messages": [{"role": "user", "content": "hi"}], "max_new_tokens": 2, "model": "both"})
    assert trained >= 1 and exported > trained and evaluated > exported and len(loads) > evaluated, loads
    assert not _asked(loads), f"loads that did not switch Hub kernels off: {_asked(loads)}"


def test_trls_reference_copy_for_full_tuning_loads_without_hub_kernels(tmp_path, loads):
    events = run_preset(tmp_path, ROOT / "resources" / "presets" / "tiny_dpo.yaml",
                        ["technique.method=full", "train.max_steps=1", "train.cpu_threads=1", "data.max_examples=24",
                         "train.eval_steps=0", "train.seq_len=64"])
    assert events[-1].type == "JobFinished", events[-1]
    assert len(loads) >= 2, loads  # the policy and TRL's frozen reference, both from the path
    assert not _asked(loads), f"loads that did not switch Hub kernels off: {_asked(loads)}"


def test_a_load_that_forgets_the_switch_is_caught(loads, tmp_path):
    """The spy itself can fail: a bare from_pretrained is recorded as not having said no."""
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(ROOT / "resources" / "tiny")
    assert [value for _, value in _asked(loads)] == ["not given"]
