"""run_prune: rank a trained model's layers, key/value head groups and FFN channels, cut what was picked,
write a model transformers loads, and measure it before and after.

Reads top to bottom as the job runs: check the picks against config.json (refusals before anything
loads), merge the run's adapter into a scratch folder (the merged export's code), load it, rank on the
first `samples` rows of the run's training data, measure perplexity on the run's validation split and
exact match on its held-out prompts, cut in place, write the pruned folder (config.json with the new
shapes, the tokenizer, heal.yaml: the run's config with model.path set to it) into a temporary folder,
reload it with plain transformers and measure it again, estimate a training step of each, write
prune_report.json and rename the folder into place. `rank_only` writes prune_ranking.json in the run
folder and stops after ranking. A Stop between stages cancels it and leaves nothing behind.
"""

from __future__ import annotations

import datetime
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from backend.core.config.run_config import RunConfig
from backend.core.errors import JobError, bad_input
from backend.core.protocol import Capabilities, JobFinished, JobStarted, PhaseChanged
from backend.pruning.request import PruneRequest, Shape, kept_channels, out_problem
from backend.pruning.report import HEAL, RANKING, REPORT, write_json
from backend.pruning.source import DTYPES, PruneSource
from backend.runtime.reporter import Reporter
from backend.runtime.stop_listener import StopListener

log = logging.getLogger(__name__)
STAGES = ("check", "merge", "rank", "measure", "prune", "write", "reload", "report")


def shape_of(config: Any) -> dict[str, Any]:
    return {"num_hidden_layers": config.num_hidden_layers, "num_attention_heads": config.num_attention_heads,
            "num_key_value_heads": config.num_key_value_heads, "intermediate_size": config.intermediate_size,
            **({"layer_types": list(config.layer_types)} if getattr(config, "layer_types", None) else {})}


def out_folder(run_dir: Path, request: PruneRequest, source: PruneSource) -> Path:
    """The pruned model's folder, refused when it would overwrite the run's or the model's own files."""
    out = Path(request.out or run_dir / "pruned").expanduser().absolute()
    problem = out_problem(out, request.overwrite, [Path(run_dir), source.folder])
    if problem:
        raise bad_input(problem)
    return out


def run_prune(config: RunConfig, run_dir: Path, reporter: Reporter, stop: StopListener, *, resume: bool = False,
              capabilities: Capabilities | None = None, params: dict | None = None) -> None:
    began = time.monotonic()
    run_dir = Path(run_dir)
    request = PruneRequest.parse(params or {})
    reporter.emit(JobStarted(job="prune", run_dir=str(run_dir), max_steps=len(STAGES)))

    def stage(name: str, detail: str) -> None:
        if stop.requested:
            raise JobError("cancelled", f"prune cancelled before {name}; nothing was written")
        reporter.emit(PhaseChanged(phase=name, detail=detail))

    def on_batch(done: int, total: int) -> None:  # a Stop during a long ranking or measurement
        if stop.requested:
            raise JobError("cancelled", "prune cancelled while measuring; nothing was written")

    source = PruneSource.check(run_dir, config, request)
    out = None if request.rank_only else out_folder(run_dir, request, source)
    stage("check", f"{source.described}; {request.picks(source.shape)}")
    tmp = (out or run_dir / "pruned").with_name(f".{(out or run_dir / 'pruned').name}.partial-{os.getpid()}")
    try:
        shutil.rmtree(tmp, ignore_errors=True)  # left by an earlier process of the same id
        tmp.mkdir(parents=True)
        _prune(config, run_dir, reporter, (stage, on_batch), request, source, out, tmp, began)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _prune(config: RunConfig, run_dir: Path, reporter: Reporter, hooks: tuple[Any, Any], request: PruneRequest,
           source: PruneSource, out: Path | None, tmp: Path, began: float) -> None:
    stage, on_batch = hooks
    from backend.pruning.importance import rank
    from backend.pruning.removal import parameter_count
    from backend.training.tokenized import build_datasets
    from backend.training.model.loading import load_tokenizer

    tokenizer = source.tokenizer()
    data_tokenizer = load_tokenizer(source.folder if source.run is None else source.run.base_path, config)
    train_set, eval_set, stats = build_datasets(config, data_tokenizer)
    calibration = [train_set[i] for i in range(min(request.samples, len(train_set)))]
    stage("merge", "the adapter merged into the base (the merged export)" if source.run else "reading the folder")
    folder = source.materialize(tmp / ".merged", tokenizer)
    estimate_before = _estimate(config, folder)
    model = source.load(folder)
    with torch.no_grad():  # as it will be written (a no-op for the merge, written in that dtype already)
        for param in model.parameters():
            param.copy_(param.to(DTYPES[source.dtype]).float())
    batch = config.train.micro_batch_size
    stage("rank", f"{len(calibration)} rows of {config.data.path}")
    ranking = rank(model, calibration, data_tokenizer.pad_token_id, batch, on_batch)
    if request.rank_only:
        payload = {"created": _now(), "source": source.described, **ranking.to_json()}
        write_json(run_dir / RANKING, payload)
        shutil.rmtree(tmp, ignore_errors=True)
        reporter.emit(PhaseChanged(phase="ranked", detail=str(run_dir / RANKING)))
        reporter.emit(JobFinished(run_dir=str(run_dir), seconds=time.monotonic() - began))
        return
    prompts, skipped = _prompts(config, request.limit)
    skipped += [] if eval_set is not None else ["perplexity skipped: the run has no validation split"]
    stage("measure", "the model before pruning")
    before = _measure(model, tokenizer, eval_set, prompts, data_tokenizer.pad_token_id, batch, request, on_batch)
    params_before, shape_before = parameter_count(model), shape_of(model.config)

    stage("prune", request.picks(source.shape))
    removed = _cut(model, ranking, request, source.shape)
    stage("write", f"{source.dtype} into {tmp.name}")
    model.to(DTYPES[source.dtype]).save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    del model
    PruneSource.discard(tmp / ".merged")
    stage("reload", "with transformers AutoModelForCausalLM, measuring it again")
    pruned = source.load(tmp)
    expected = shape_of(pruned.config)
    _check_shapes(tmp, expected, source.shape, removed)
    after = _measure(pruned, tokenizer, eval_set, prompts, data_tokenizer.pad_token_id, batch, request, on_batch)
    params_after = parameter_count(pruned)
    del pruned

    heal = _heal(config, tmp, out, request.picks(source.shape))
    report = {
        "created": _now(), "source": source.described, "path": str(out), "dtype": source.dtype,
        "model_type": source.shape.model_type, "picks": request.picks(source.shape), "removed": removed,
        "shapes": {"before": shape_before, "after": expected},
        "parameters": {"before": params_before, "after": params_after},
        "estimate": {**estimate_before, "after_bytes": _estimate(config, tmp).get("before_bytes")},
        "perplexity": None, "exact_match": None, "skipped": skipped, "data_notes": list(stats.notes),
        "heal": heal, "ranking": ranking.to_json(), "seconds": round(time.monotonic() - began, 2),
    }
    if before["ppl"] is not None:
        report["perplexity"] = {"split": "validation", "examples": stats.eval_examples, "tokens": before["ppl"].tokens,
                                "before": before["ppl"].to_json(), "after": after["ppl"].to_json()}
    if before["em"] is not None:
        report["exact_match"] = {"prompts_file": str(prompts[0]), "n": len(prompts[1]),
                                 "before": before["em"].to_json(), "after": after["em"].to_json()}
    stage("report", f"{REPORT} in {out}")
    write_json(tmp / REPORT, report)
    if out.exists():
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, out)
    reporter.emit(PhaseChanged(phase="pruned", detail=f"{out}: parameters {params_before:,} -> {params_after:,}; "
                                                      f"heal it with {heal['command']}"))
    reporter.emit(JobFinished(run_dir=str(run_dir), seconds=time.monotonic() - began))


def _now() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def _prompts(config: RunConfig, limit: int | None) -> tuple[Any, list[str]]:
    """(prompts file, prompts) beside the training data, or None and why exact match is skipped."""
    from backend.evaluation.prompts import default_prompts_file, read_prompts

    path = default_prompts_file(config)
    if path is None:
        return None, ["exact match skipped: no held-out prompts file lies beside the training data"]
    return (path, read_prompts(path, limit)), []


def _measure(model: Any, tokenizer: Any, eval_set: Any, prompts: Any, pad_id: int, batch: int,
             request: PruneRequest, on_batch: Any) -> dict[str, Any]:
    from backend.evaluation.exact_match import exact_match
    from backend.evaluation.perplexity import perplexity

    with torch.no_grad():
        ppl = perplexity(model, eval_set, pad_id, batch, on_batch) if eval_set is not None else None
        em = (exact_match(model, tokenizer, prompts[1], request.max_new_tokens, max(batch, 16), on_batch)
              if prompts and prompts[1] else None)
    return {"ppl": ppl, "em": em}


def _cut(model: Any, ranking: Any, request: PruneRequest, shape: Shape) -> dict[str, Any]:
    """Apply the picks (heads, channels, then layers: the user's indices refer to the original model)."""
    from backend.pruning.removal import drop_head_groups, drop_layers, keep_channels

    removed: dict[str, Any] = {"layers": [], "head_groups": None, "ffn_kept": None}
    if isinstance(request.drop_heads, int):
        removed["head_groups"] = ranking.least_groups(request.drop_heads)
    elif request.drop_heads:
        removed["head_groups"] = [sorted(g for l, g in request.drop_heads if l == i) for i in range(shape.layers)]
    if removed["head_groups"]:
        drop_head_groups(model, removed["head_groups"])
    if request.ffn_keep is not None:
        keep = kept_channels(shape.intermediate, request.ffn_keep)
        if keep < shape.intermediate:
            keep_channels(model, ranking.kept_channels(keep))
        removed["ffn_kept"] = keep
    layers = request.drop_layers or (ranking.least_layers(request.layers) if request.layers else [])
    if layers:
        drop_layers(model, layers)
    removed["layers"] = sorted(layers)
    return removed


def _check_shapes(folder: Path, loaded: dict[str, Any], shape: Shape, removed: dict[str, Any]) -> None:
    """The reloaded model has the shapes the cuts promise, or the job fails saying which."""
    want = {"num_hidden_layers": shape.layers - len(removed["layers"]),
            "intermediate_size": removed["ffn_kept"] or shape.intermediate,
            "num_key_value_heads": shape.kv_heads - (len(removed["head_groups"][0]) if removed["head_groups"] else 0)}
    for key, value in want.items():
        if loaded[key] != value:
            raise JobError("crashed", f"{folder}/config.json: {key} is {loaded[key]}, the pruning made {value}")


def _heal(config: RunConfig, tmp: Path, out: Path, picks: str) -> dict[str, str]:
    """heal.yaml beside the model: the run's config, training the pruned folder (a new adapter)."""
    model = config.model.model_copy(update={"path": str(out), "adapter": ""})
    heal = config.model_copy(update={"model": model, "name": f"{config.name}-pruned-heal"[:60]})
    command = f"finetune-studio train {out / HEAL}"
    header = (f"# Title: {config.name}, pruned, healed by a new {config.technique.method} run\n"
              f"# {config.name} pruned ({picks}); this run tunes the pruned model again to win back\n"
              f"# what pruning cost (prune_report.json beside it has the figures before and after).\n"
              f"# Run it:   {command}\n")
    (tmp / HEAL).write_text(header + heal.to_yaml(), encoding="utf-8")
    return {"config": str(out / HEAL), "command": command}


def _estimate(config: RunConfig, folder: Path) -> dict[str, Any]:
    """A training step of the run's config on the model in `folder` (backend/estimate), on this machine's
    device; under before_bytes, and the problem in one line when config.json cannot be estimated."""
    from backend.estimate import estimate

    device = "cuda" if torch.cuda.is_available() else "cpu"
    figures: dict[str, Any] = {"device": device, "method": config.technique.method, "before_bytes": None}
    try:
        figures["before_bytes"] = int(estimate(folder, config, device=device).total_bytes)
    except ValueError as exc:
        figures["problem"] = str(exc)
    return figures
