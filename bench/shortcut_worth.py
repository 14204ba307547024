"""Each speed shortcut's own worth, switched per training step in one process (bench/throughput.py --toggle).

Runs of whole jobs on a shared host differ by more than a few percent minutes apart, which is more
than most single shortcuts are worth; so here one model is loaded once, with every shortcut the
registry chooses installed, and each batch is trained on (forward + backward) once per variant:
all on ("auto"), all off ("off"), and all but one ("-name"), in an order that rotates per batch.
A variant's worth is the median over batches of its own step time against the same batch's
auto step, seconds apart. Every variant must give the auto step's loss (1e-4): a toggle that
changed the computation would show here. Run with the worker's environment (passive OpenMP waits)
and thread count.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path


def toggle_worth(preset: Path, overrides: list[str], steps: int, only: list[str] | None = None) -> int:
    """`only`: the shortcuts to leave out one at a time (default: every one the plan uses)."""
    import torch

    from backend.core.config.run_config import RunConfig
    from backend.training.model.capabilities import default_threads, probe_capabilities
    from backend.training.tokenized import PackingCollator, PadCollator, build_datasets
    from backend.training.shortcuts.last_layer_rows import LastLayerRows
    from backend.training.model.loading import add_adapters, check_model_folder, load_model, load_tokenizer
    from backend.training.shortcuts.lora_matmul import LoraMatmul
    from backend.training.shortcuts.loss_positions import keep_loss_positions
    from backend.training.model.model_facts import ModelFacts
    from backend.training.model.techniques import plan_techniques

    config = RunConfig.load(preset, overrides)
    torch.set_num_threads(config.train.cpu_threads or default_threads())
    path = check_model_folder(config)
    plan = plan_techniques(config, probe_capabilities(), ModelFacts.read(path), 1)
    print(f"plan: {plan.summary()}; {torch.get_num_threads()} thread(s)", flush=True)
    tokenizer = load_tokenizer(path, config)
    train_set, _, _ = build_datasets(config, tokenizer)
    torch.manual_seed(config.train.seed)
    model = add_adapters(load_model(path, config, plan), config, plan)
    model.train()
    applied = [n for n in plan.shortcuts.applied if n not in ("thread_choice", "bf16_base")]
    matmul = LoraMatmul(rank_first=True)
    if "rank_first_lora" in applied:
        matmul.install(model)
    rows = LastLayerRows()
    if "last_layer_rows" in applied:
        rows.install(model)
    packed = "sdpa_packed" in applied
    collate = PackingCollator() if config.technique.packing else PadCollator(tokenizer.pad_token_id)
    batch_size = config.train.micro_batch_size
    order = torch.randperm(len(train_set), generator=torch.Generator().manual_seed(config.train.seed)).tolist()
    batches = [collate([train_set[i] for i in order[k * batch_size:(k + 1) * batch_size]]) for k in range(steps + 1)]

    def step(batch: dict, without: set[str]) -> tuple[float, float]:
        matmul.active = "rank_first_lora" not in without
        model.config._attn_implementation = "sdpa" if packed and "sdpa_packed" in without else (
            "sdpa_packed" if packed else model.config._attn_implementation)
        keep = "loss_positions" in applied and "loss_positions" not in without
        inputs = keep_loss_positions(batch) if keep else batch
        rows.mask = inputs.get("logits_to_keep") if keep and "last_layer_rows" not in without else None
        items = (batch["labels"][:, 1:] != -100).sum()
        began = time.perf_counter()
        loss = model(**inputs, use_cache=False, num_items_in_batch=items).loss
        loss.backward()
        seconds = time.perf_counter() - began
        rows.mask = None
        model.zero_grad(set_to_none=True)
        return seconds, float(loss.detach())

    variants = {"auto": set(), "off": set(applied), **{f"-{n}": {n} for n in applied if not only or n in only}}
    step(batches[0], set())  # warm-up: oneDNN's kernels, the allocator
    times: dict[str, list[float]] = {v: [] for v in variants}
    names = list(variants)
    for k, batch in enumerate(batches[1:]):
        losses = {}
        for name in names[k % len(names):] + names[:k % len(names)]:
            seconds, losses[name] = step(batch, variants[name])
            times[name].append(seconds)
        drift = max(abs(loss - losses["auto"]) for loss in losses.values())
        assert drift < 1e-4 * max(1.0, abs(losses["auto"])), (k, losses)
        print(f"batch {k + 1} ({int(batch['input_ids'].numel())} tokens): "
              + ", ".join(f"{v} {1000 * times[v][-1]:.0f} ms" for v in names), flush=True)
    print(f"all losses of a batch agree within 1e-4 across variants; {steps} batches")
    for name in names[1:]:
        ratios = [other / auto for other, auto in zip(times[name], times["auto"])]
        what = "all shortcuts (off/auto)" if name == "off" else f"{name[1:]} (without it/auto)"
        print(f"worth of {what:40}: median {statistics.median(ratios):.3f}x, "
              f"quartiles {statistics.quantiles(ratios, n=4)[0]:.3f}-{statistics.quantiles(ratios, n=4)[2]:.3f}x")
    return 0

