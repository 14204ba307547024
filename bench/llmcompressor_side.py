"""llmcompressor's side of bench/calibrated_vs_llmcompressor.py: one calibrated format written by its `oneshot`.

Run by the llmcompressor venv's interpreter (never by ours: the project does not import llmcompressor), on the
merged model folder and the exact calibration token ids our export used, with the group size our writer picks:

    VENV/bin/python bench/llmcompressor_side.py FORMAT MODEL ROWS.json OUT --group 128

Prints one line `RESULT {json}`: seconds to load, to calibrate (oneshot) and to save, and the versions.
RECIPES holds each of our format names' llmcompressor recipe. On a machine without an accelerator, AWQ's
smoothing pins its cached activations for faster host-to-device copies (IntermediatesCache.pin_memory), which
fails there with "Cannot access accelerator device when none is available": `unpin_on_cpu` makes it a no-op.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any, Callable

IGNORE = ["lm_head"]
"""What stays 16-bit beside the embeddings and norms, as our writer leaves every linear outside the decoder layers."""


def _scheme(preset: str, group: int, actorder: str | None = None) -> dict[str, Any]:
    """config_groups of one compressed-tensors preset over every Linear, 4-bit groups of `group` columns."""
    from compressed_tensors.quantization.quant_scheme import preset_name_to_scheme

    scheme = preset_name_to_scheme(preset, ["Linear"])
    if scheme.weights.group_size is not None:
        scheme.weights.group_size = group
    if actorder:
        scheme.weights.actorder = actorder
    return {"group_0": scheme}


def gptq_w4a16(group: int) -> list:
    """GPTQ, 4-bit symmetric weights in groups, static activation order (llmcompressor's default)."""
    from llmcompressor.modifiers.gptq import GPTQModifier

    return [GPTQModifier(config_groups=_scheme("W4A16", group, "static"), ignore=IGNORE)]


def awq_w4a16_asym(group: int) -> list:
    """AWQ (its defaults: duo scaling, grid of 20, its model's mappings), then round-to-nearest 4-bit asymmetric
    weights in groups (0.14's AWQModifier only scales; a QuantizationModifier rounds)."""
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from llmcompressor.modifiers.transform.awq import AWQModifier

    return [AWQModifier(), QuantizationModifier(config_groups=_scheme("W4A16_ASYM", group), ignore=IGNORE)]


def smoothquant_gptq_w8a8(group: int) -> list:
    """SmoothQuant (strength 0.8), then GPTQ on 8-bit per-channel weights with 8-bit dynamic per-token inputs."""
    from llmcompressor.modifiers.gptq import GPTQModifier
    from llmcompressor.modifiers.transform.smoothquant import SmoothQuantModifier

    return [SmoothQuantModifier(smoothing_strength=0.8), GPTQModifier(config_groups=_scheme("W8A8", group),
                                                                      ignore=IGNORE)]


RECIPES: dict[str, Callable[[int], list]] = {
    "gptq-int4": gptq_w4a16,
    "awq-int4": awq_w4a16_asym,
    "w8a8": smoothquant_gptq_w8a8,
}
"""Our format name -> the llmcompressor recipe compared with it (given the group size)."""


def unpin_on_cpu() -> bool:
    """Without an accelerator, make IntermediatesCache.pin_memory a no-op (pinning needs one); True if patched."""
    import torch
    from llmcompressor.pipelines.cache import IntermediatesCache

    if torch.accelerator.is_available():
        return False
    IntermediatesCache.pin_memory = lambda self, batch_index, input_names=None: None
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("format", choices=sorted(RECIPES))
    parser.add_argument("model", type=Path, help="the merged model folder")
    parser.add_argument("rows", type=Path, help='JSON {"rows": [[token id, ...], ...]}: the calibration rows')
    parser.add_argument("out", type=Path)
    parser.add_argument("--group", type=int, required=True, help="4-bit group size (our writer's)")
    args = parser.parse_args()

    import compressed_tensors
    import llmcompressor
    import torch
    import transformers
    from datasets import Dataset
    from llmcompressor import oneshot
    from transformers import AutoModelForCausalLM, AutoTokenizer

    unpinned = unpin_on_cpu()
    rows = json.loads(args.rows.read_text())["rows"]
    data = Dataset.from_dict({"input_ids": rows, "attention_mask": [[1] * len(r) for r in rows]})
    began = time.monotonic()
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype="auto")
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    loaded = time.monotonic()
    oneshot(model=model, processor=tokenizer, dataset=data, recipe=RECIPES[args.format](args.group),
            num_calibration_samples=len(rows), max_seq_length=max(map(len, rows)), shuffle_calibration_samples=False)
    calibrated = time.monotonic()
    model.save_pretrained(args.out, save_compressed=True)
    tokenizer.save_pretrained(args.out)
    saved = time.monotonic()
    print("RESULT " + json.dumps({
        "load_s": loaded - began, "calibrate_s": calibrated - loaded, "save_s": saved - calibrated,
        "dtype": str(next(model.parameters()).dtype).replace("torch.", ""), "unpinned": unpinned,
        "recipe": RECIPES[args.format].__doc__.splitlines()[0],
        "versions": {"llmcompressor": llmcompressor.__version__, "compressed-tensors": compressed_tensors.__version__,
                     "transformers": transformers.__version__, "torch": torch.__version__}}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
