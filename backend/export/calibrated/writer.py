"""Writing and reloading a calibrated export: merged 16-bit scratch copy -> calibrated in memory -> quantized
and packed one layer at a time (pack.py) -> compressed-tensors folder (config.json's quantization_config,
packed int4 or int8 weights).

The scratch copy is the merged export itself (hf_writer.write_merged: a QLoRA base dequantized from the
very NF4 weights it trained against), so "merge, then quantize" shares every line of the merged path.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any, Callable

import torch

from backend.core.errors import JobError
from backend.core.registries.export_formats import export_format
from backend.export import hf_writer
from backend.export.calibrated import awq, gptq, grid, layers, pack, samples, scaling, vision_capture
from backend.export.calibrated.collect import calibrate
from backend.export.memory import release
from backend.export.merge import DTYPES, TrainedRun, placement
from backend.export.verify import fp32_linear as verify_fp32_linear
from backend.runtime.hub_kernels import LOAD_KWARGS
from backend.training.model import packed_zero_points

log = logging.getLogger(__name__)
STATISTICS_SHARE = 0.25
"""The calibration statistics held at once, as a share of the model's 16-bit size (more takes more passes)..."""
STATISTICS_FLOOR = 64 * 1024 * 1024
"""...or this many bytes, whichever is more: below it a pass costs more time than its memory is worth."""


def write_calibrated(fmt: str, source: Any, run: TrainedRun, tokenizer: Any, tmp: Path, dtype: str,
                     calibration_samples: int, device: str,
                     progress: Callable[[int, int], None] | None = None,
                     should_stop: Callable[[], bool] | None = None,
                     tell: Callable[[str], None] | None = None) -> list[str]:
    """Write `fmt` into `tmp`; returns the report's notes (calibration data, passes, group size). `tell` gets
    a line per decoder layer calibrated, with the time left ("gptq: layer 7/30, 41 s left"). A vision-language
    run's whole image-text model is loaded and calibrated on its image rows, its language model's decoder
    layers quantized and its tower and projector kept 16-bit (vision_capture.py)."""
    from backend.core.vision_folder import VisionFolder
    from backend.export.model_layout import auto_model_class

    scratch = tmp / ".scratch-16bit"
    scratch.mkdir()
    hf_writer.write_merged(source, run, tokenizer, scratch, dtype, progress, should_stop)
    trust = run.config.model.trust_remote_code
    family = VisionFolder.read(scratch).family
    model = auto_model_class(scratch).from_pretrained(scratch, dtype=DTYPES[dtype], **placement(device),
                                                      trust_remote_code=trust, **LOAD_KWARGS).eval()
    if family is not None:
        vision_capture.check_layers(family, layers.decoder_layers(model)[0])
    linears = layers.quantized_linears(model)
    spec = export_format(fmt)
    try:
        group = layers.group_size(linears) if spec.bits == 4 else 0  # 4-bit weights are scaled in groups
    except ValueError as exc:
        raise JobError("bad_input", f"{fmt}: {exc}", "export w8a8 or gguf-q8_0 instead") from None
    scheme = grid.scheme(fmt, group)
    rows, described = (vision_capture.image_calibration_rows(run.config, calibration_samples, DTYPES[dtype])
                       if family is not None else samples.calibration_rows(run.config, tokenizer, calibration_samples))
    qparams: dict[torch.nn.Module, tuple[torch.Tensor, torch.Tensor]] = {}
    scale_dtype = DTYPES[dtype]
    units, algorithm = ALGORITHMS[spec.algorithm](model, linears, scheme, scale_dtype, qparams, rows)
    budget = max(int(sum(p.numel() for p in model.parameters()) * 2 * STATISTICS_SHARE), STATISTICS_FLOOR)
    with vision_capture.between_layers(model, layers.decoder_layers(model)[1]):
        runs = calibrate(model, rows, units, budget, should_stop, spec.algorithm, tell)
    release()  # the calibration's activations, handed back before the packed copies are made
    ignore = sorted({name for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)} - set(linears))
    kept = vision_capture.kept_parts(family, ignore) if family is not None else ", ".join(ignore)
    names = {module: name for name, module in linears.items()}
    rounded = [names[m] for unit in units for m in getattr(unit, "fallbacks", [])]
    compressor = pack.pack(model, linears, qparams, scheme, ignore, scale_dtype, should_stop)
    if family is not None:
        vision_capture.ignore_by_pattern(compressor, family, ignore)
    pack.save(model, compressor, tmp)
    del model
    _finish_folder(scratch, tmp, tokenizer)
    shutil.rmtree(scratch)
    notes = [f"calibrated on {described}, one decoder layer at a time, each fed the quantized layers' outputs "
             f"({runs} run(s) of a layer with statistics)",
             f"{algorithm}; {len(linears)} linear layers quantized to the compressed-tensors "
             f"{pack.format_name(compressor)} format ({spec.scheme}"
             + (f", groups of {group}" if group else "") + "); kept 16-bit: embeddings, norms"
             + (f", {kept}" if kept else "")]
    if rounded:
        notes.append(f"GPTQ rounded {', '.join(rounded)} to nearest: the Cholesky factorisation of their inputs' "
                     "Hessian failed even damped (more or more varied calibration samples may avoid it)")
    return notes


def _gptq(model: Any, linears: dict, scheme: Any, scale_dtype: torch.dtype, qparams: dict,
          rows: list) -> tuple[list, str]:
    """GPTQ on each set of layers sharing an input; it fills `qparams` with the scales it rounded to."""
    units = [gptq.GptqUnit(g, scheme.weights, scale_dtype, qparams) for g in gptq.shared_inputs(linears)]
    return units, (f"GPTQ (activation order with static groups, blocks of {gptq.BLOCK} columns, damping 1% of the "
                   "mean Hessian diagonal)")


def _awq(model: Any, linears: dict, scheme: Any, scale_dtype: torch.dtype, qparams: dict,
         rows: list) -> tuple[list, str]:
    """AWQ's per-input-channel scales (llmcompressor's search) folded into the layer feeding them, then AutoAWQ's
    clipping search; the asymmetric groups are rounded to nearest when packed."""
    units = awq.units(model, linears, scheme.weights, scale_dtype, sum(map(len, rows)))
    kept = next((unit.tokens for unit in units if hasattr(unit, "tokens")), 0)  # Gemma's first unit clips only
    return units, (f"AWQ as llmcompressor runs it (duo scaling on a grid of {awq.GRID}, loss on each parent module's "
                   f"output over up to {kept} calibration positions, v->o where shapes allow), AutoAWQ's "
                   "clipping search, then round-to-nearest into asymmetric groups")


def _smoothquant(model: Any, linears: dict, scheme: Any, scale_dtype: torch.dtype, qparams: dict,
                 rows: list) -> tuple[list, str]:
    """llmcompressor's W8A8 recipe: SmoothQuant's per-input-channel scales, moving activation outliers into the
    weights, then GPTQ on the 8-bit per-channel weights (on the smoothed inputs: collect.py's stages)."""
    units = [scaling.SmoothQuantUnit(m) for m in layers.mappings(model, False)]
    units += [gptq.GptqUnit(g, scheme.weights, scale_dtype, qparams) for g in gptq.shared_inputs(linears)]
    return units, (f"SmoothQuant (alpha {scaling.SMOOTHING}), then GPTQ on per-channel int8 weights (activation "
                   "order, damping 1% of the mean Hessian diagonal)")


ALGORITHMS: dict[str, Callable[..., tuple[list, str]]] = {"gptq": _gptq, "awq": _awq, "smoothquant": _smoothquant}
"""A calibrated format's `algorithm` (export_formats.py) -> (the calibration units, the report's words)."""


def _finish_folder(scratch: Path, tmp: Path, tokenizer: Any) -> None:
    """The merged copy's generation config and the run's tokenizer beside the quantized weights."""
    for name in ("generation_config.json", *hf_writer.PROCESSOR_FILES):  # a VLM's processor too
        if (scratch / name).is_file():
            shutil.copy2(scratch / name, tmp / name)
    tokenizer.save_pretrained(tmp)
    config = json.loads((tmp / "config.json").read_text(encoding="utf-8"))
    config["use_cache"] = True
    (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


class Fp32ProductLinear(torch.nn.Linear):
    """A 16-bit linear layer whose product runs in fp32 (verify.cpu_products_in_fp32's product, which the
    check's other layers get), under compressed-tensors' own forward, which still rounds W8A8's inputs."""

    forward = verify_fp32_linear


def load_calibrated_export(path: Path, dtype: str, device: str, trust_remote_code: bool = False) -> tuple[Any, str, str]:
    """(model as transformers loads the folder through compressed-tensors, description, the dtype it holds).
    On a CPU the unpacked layers multiply in fp32 like the reference's, their weights staying 16-bit."""
    from backend.export.model_layout import auto_model_class

    packed_zero_points.allow()  # awq-int4's asymmetric groups: compressed-tensors 0.20.1 cannot load them alone
    model = auto_model_class(path).from_pretrained(path, dtype=DTYPES[dtype], **placement(device),
                                                 trust_remote_code=trust_remote_code, **LOAD_KWARGS).eval()
    quantized = [m for m in model.modules() if getattr(m, "quantization_scheme", None) is not None]
    if not quantized:
        raise RuntimeError(f"{path} did not load quantized: no compressed-tensors layers")
    with torch.no_grad():  # compressed-tensors unpacks the weights on the first forward pass
        model(input_ids=torch.tensor([[0]], device=device), use_cache=False)
    release()  # the unpacking's freed temporaries, which glibc's heap would keep through the check
    if device == "cpu":
        for module in quantized:
            if type(module) is torch.nn.Linear:
                module.__class__ = Fp32ProductLinear
    acts = quantized[0].quantization_scheme.input_activations
    what = "8-bit dynamic per-token activations" if acts is not None else "16-bit activations"
    products = ", products in fp32" if device == "cpu" else ""
    return model, (f"transformers with compressed-tensors, {len(quantized)} linear layers unpacked from the file's "
                   f"integers and scales to {dtype}, {what}{products}, on {device}"), dtype
