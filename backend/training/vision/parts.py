"""Which parts of a VLM train and how: the language model by the technique, the vision tower and projector
by the `vision` section (frozen, lora or full).

The parts are the registry's parameter-name prefixes (vision_parts.part_of), so LoRA targets, full
tuning and the 16-bit skip list of QLoRA/LoRA8 all follow the model transformers builds. A part tuned
`full` under a LoRA method goes into peft's modules_to_save, so the adapter folder carries its weights.
"""

from __future__ import annotations

from typing import Any

import torch

from backend.core.config.run_config import RunConfig
from backend.core.errors import bad_input
from backend.core.registries.vision_families import VisionFamily
from backend.training.model.vision_parts import LANGUAGE, PROJECTOR, TOWER, part_of

PEFT_WRAPPERS = ("base_model.model.", )
PEFT_INFIXES = (".modules_to_save.default", ".original_module", ".base_layer")
HEAD = ("lm_head", "model.lm_head")


def plain_name(name: str) -> str:
    """A parameter or module name as the bare model names it, peft's wrappers taken out."""
    for prefix in PEFT_WRAPPERS:
        if name.startswith(prefix):
            name = name[len(prefix):]
    for infix in PEFT_INFIXES:
        name = name.replace(infix, "")
    return name


def tuning(config: RunConfig) -> dict[str, str]:
    """Part -> frozen | lora | full; the language model's is the technique's."""
    method = config.technique.method
    language = "full" if method == "full" else "lora"
    parts = {LANGUAGE: language, TOWER: config.vision.tower, PROJECTOR: config.vision.projector}
    if method == "full":
        for part, key in ((TOWER, "tower"), (PROJECTOR, "projector")):
            if parts[part] == "lora":
                raise bad_input(f"vision.{key}: lora needs a LoRA technique, and technique.method is full",
                                f"set vision.{key} to frozen or full, or pick lora/dora/qlora")
    return parts


def part_roots(model: Any, family: VisionFamily, part: str) -> list[str]:
    """The outermost modules of `part` (e.g. model.visual.merger): what modules_to_save wraps."""
    modules = dict(model.named_modules())
    names = [n for n in modules if n and part_of(n + ".", family) == part
             and not isinstance(modules[n], (torch.nn.ModuleList, torch.nn.ModuleDict))]
    return [n for n in names if not any(n.startswith(other + ".") for other in names if other != n)]


def lora_targets(model: Any, family: VisionFamily, config: RunConfig) -> list[str]:
    """Full names of the linear layers to adapt: the language model's (by technique.lora_targets), and the
    tower's and projector's when vision says lora. The output head is never adapted."""
    parts = tuning(config)
    wanted = config.technique.lora_targets.strip()
    names = None if wanted == "all-linear" else {t.strip() for t in wanted.split(",") if t.strip()}
    out = []
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear) or name in HEAD or name.endswith(".lm_head"):
            continue
        part = part_of(name + ".", family)
        if parts.get(part) != "lora":
            continue
        if part == LANGUAGE and names is not None and name.rsplit(".", 1)[-1] not in names:
            continue
        out.append(name)
    if not out:
        raise bad_input(f"technique.lora_targets {wanted!r}: no linear layer of the language model matches",
                        "use all-linear or names like q_proj,v_proj")
    return out


def saved_modules(model: Any, family: VisionFamily, config: RunConfig) -> list[str]:
    """Modules trained whole beside LoRA (a part tuned full): peft saves them in the adapter folder."""
    parts = tuning(config)
    return [root for part in (TOWER, PROJECTOR) if parts[part] == "full" for root in part_roots(model, family, part)]


def skip_quantization(family: VisionFamily) -> list[str]:
    """Module names bitsandbytes must leave in 16-bit: the tower, the projector, other towers and the head.
    Read from the prefixes, so it needs no model: transformers matches a name or a name's start."""
    prefixes = list(family.tower) + list(family.projector) + [p for _, ps in family.other for p in ps]
    return sorted({p.rstrip(".") for p in prefixes} | {"lm_head"})


def set_trainable(model: Any, family: VisionFamily, config: RunConfig) -> dict[str, int]:
    """requires_grad by part after the adapters are on: LoRA weights train, a `full` part trains, a frozen
    part and the LoRA-wrapped base do not. -> trainable parameters per part (for the log and the tests)."""
    parts = tuning(config)
    counts = {LANGUAGE: 0, TOWER: 0, PROJECTOR: 0}
    for name, parameter in model.named_parameters():
        bare = plain_name(name)
        part = part_of(bare, family)
        if "lora_" in name:
            train = True
        elif ".original_module." in name:
            train = False
        else:
            train = parts.get(part) == "full"
        parameter.requires_grad_(train and parameter.is_floating_point())
        if parameter.requires_grad:
            counts[part if part in counts else TOWER] += parameter.numel()
    return counts
