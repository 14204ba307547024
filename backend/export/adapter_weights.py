"""AdapterWeights: a saved peft LoRA/DoRA adapter, matched to the base checkpoint's tensors.

peft saves one `lora_A`/`lora_B` pair (and, for DoRA, a `lora_magnitude_vector`) per adapted module,
keyed by the in-memory module name under `base_model.model.`. Each is matched here to the disk tensor
it changes (through ModelLayout) with its own scaling: lora_alpha / r, or lora_alpha / sqrt(r) for
rsLoRA, with peft's rank_pattern / alpha_pattern overrides. A `modules_to_save` module (a VLM's projector
tuned full) is saved whole under its own name: its tensors replace the base's (`replaced`). Anything this
merge does not reproduce exactly (LoRA biases, other peft methods) is refused in one sentence rather than
merged approximately. peft's ParamWrapper on fused MoE experts (`target_parameters`) is merged into
each expert's own disk tensors, with peft's (expert, rank) layout of its A and B.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from backend.core.errors import bad_input
from backend.export.checkpoint_files import CheckpointFiles
from backend.export.model_layout import ModelLayout

PREFIX = "base_model.model."
ROLES = {".lora_A.weight": "A", ".lora_B.weight": "B", ".lora_magnitude_vector": "magnitude",
         ".lora_embedding_A": "A", ".lora_embedding_B": "B"}


@dataclass
class AdaptedModule:
    module: str  # in-memory module name, as peft saw it
    disk_name: str  # the base checkpoint tensor it changes
    kind: str  # linear | conv1d | embedding | experts (peft's ParamWrapper on a fused 3-D parameter)
    a_key: str
    b_key: str
    magnitude_key: str | None
    scaling: float
    expert: int = -1  # kind experts: the expert this disk tensor holds (-1: a fused disk tensor, all of them)
    rows: tuple[int, int] = (0, 0)  # kind experts: its rows of the fused parameter (gate, then up)
    experts: int = 0


class AdapterWeights:
    """Which base tensors an adapter changes, and the fp32 change for each (read one module at a time)."""

    def __init__(self, folder: Path, layout: ModelLayout):
        self.folder = Path(folder)
        config_path = self.folder / "adapter_config.json"
        self.config = json.loads(config_path.read_text(encoding="utf-8"))
        peft_type = self.config.get("peft_type", "LORA")
        if peft_type != "LORA":
            raise bad_input(f"{config_path}: peft_type {peft_type} cannot be merged here (LoRA and DoRA can)",
                            "export format adapter instead")
        saved = tuple(self.config.get("modules_to_save") or ())
        if self.config.get("lora_bias"):
            raise bad_input(f"{config_path}: lora_bias adapters are not merged here", "export format adapter instead")
        self.files = CheckpointFiles(self.folder)
        self._factors: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # expert wrappers' A, B as (e, r, in), (out, r, e)
        self.use_dora = bool(self.config.get("use_dora"))
        parts: dict[str, dict[str, str]] = {}
        self.replaced: dict[str, str] = {}  # base disk tensor -> the adapter's key of its trained full copy
        for key in self.files.names():
            body = key[len(PREFIX):] if key.startswith(PREFIX) else key
            role = next(((suffix, r) for suffix, r in ROLES.items() if body.endswith(suffix)), None)
            if role is None and any(body.startswith(module + ".") for module in saved):
                self.replaced[self._replaced_disk(body, key, layout)] = key
                continue
            if role is None:
                raise bad_input(f"{self.folder / 'adapter_model.safetensors'}: key {key} is not a LoRA weight this "
                                "merge knows", "export format adapter instead")
            suffix, name = role
            parts.setdefault(body[: -len(suffix)], {})[name] = key
        self.modules: dict[str, AdaptedModule] = {}
        for module, roles in sorted(parts.items()):
            self.modules.update(self._match(module, roles, layout))

    def _replaced_disk(self, body: str, key: str, layout: ModelLayout) -> str:
        """The base tensor a modules_to_save tensor replaces, checked to be the same shape."""
        disk = layout.to_disk.get(body)
        if disk is None or tuple(layout.shapes[disk]) != tuple(self.files.info(key).shape):
            raise bad_input(f"{self.folder / 'adapter_model.safetensors'}: {key} (a module trained whole) fits no "
                            "tensor of the base checkpoint: the adapter was trained on another model",
                            "check model.path in the run's config.yaml")
        return disk

    def full_copy(self, disk_name: str) -> torch.Tensor:
        """The trained tensor of a module tuned whole, as the adapter saved it."""
        return self.files.get(self.replaced[disk_name])

    def _match(self, module: str, roles: dict[str, str], layout: ModelLayout) -> dict[str, AdaptedModule]:
        if "A" not in roles or "B" not in roles:
            raise bad_input(f"{self.folder}: module {module} has {sorted(roles)} but not both lora_A and lora_B")
        owner = module
        while owner.endswith(".base_layer"):
            owner = owner.removesuffix(".base_layer")
        if layout.expert_parameters(owner):
            return self._match_experts(module, owner, roles, layout)
        disk = layout.to_disk.get(module + ".weight")
        if disk is None:
            raise bad_input(f"the adapter changes {module}, which has no weight in the base checkpoint "
                            "(a tied lm_head, or an adapter trained on another model)", "export format adapter instead")
        # A 2-D weight of another module type (an MoE router) is adapted by peft's ParamWrapper like a Linear.
        kind = layout.kinds.get(module, "linear")
        a_shape, b_shape = self.files.info(roles["A"]).shape, self.files.info(roles["B"]).shape
        out_in = tuple(reversed(layout.shapes[disk])) if kind == "conv1d" else layout.shapes[disk]
        if kind == "embedding":
            out_in = (out_in[1], out_in[0])  # lora_embedding_A is (r, num_embeddings), lora_embedding_B (dim, r)
        if len(out_in) != 2 or (b_shape[0], a_shape[1]) != out_in or b_shape[1] != a_shape[0]:
            raise bad_input(f"{module}: adapter shapes A {list(a_shape)}, B {list(b_shape)} do not fit its base weight "
                            f"{list(layout.shapes[disk])}: the adapter was trained on another model",
                            "check model.path in the run's config.yaml")
        if self.use_dora and "magnitude" not in roles:
            raise bad_input(f"{self.folder}: DoRA module {module} has no lora_magnitude_vector: the adapter is damaged")
        if self.use_dora and kind == "embedding":
            raise bad_input(f"{module}: DoRA on an embedding is not merged here", "export format adapter instead")
        rank = self.files.info(roles["A"]).shape[0]
        return {disk: AdaptedModule(module, disk, kind, roles["A"], roles["B"], roles.get("magnitude"),
                                    self._scaling(module, rank))}

    def _match_experts(self, module: str, owner: str, roles: dict[str, str],
                       layout: ModelLayout) -> dict[str, AdaptedModule]:
        """peft's ParamWrapper on fused 3-D experts: one wrapper per targeted parameter, nested in the
        parameters' registration order (the last targeted is the outermost, `owner` itself)."""
        targets = self.config.get("target_parameters") or []
        params = [p for p in layout.expert_parameters(owner) if any(p == t or p.endswith("." + t) for t in targets)]
        depth = (len(module) - len(owner)) // len(".base_layer")
        if depth >= len(params):
            raise bad_input(f"{self.folder}: {module} adapts none of {owner}'s parameters named in target_parameters "
                            f"{targets}", "export format adapter instead")
        param = params[len(params) - 1 - depth]
        experts, rows, cols = layout.experts[param]
        if owner in layout.transposed:
            raise bad_input(f"the adapter trains {param}, held (experts, in, out), which is not merged here",
                            "export format adapter instead")
        a_shape, b_shape = self.files.info(roles["A"]).shape, self.files.info(roles["B"]).shape
        if (b_shape[0], a_shape[1]) != (rows, cols) or b_shape[1] != a_shape[0] or a_shape[0] % experts:
            raise bad_input(f"{module}: adapter shapes A {list(a_shape)}, B {list(b_shape)} do not fit {param} "
                            f"{[experts, rows, cols]}: the adapter was trained on another model",
                            "check model.path in the run's config.yaml")
        scaling = self._scaling(param, a_shape[0] // experts)
        out = {}
        for disk in layout.disk_tensors(param):
            expert, first, end = layout.slices.get(disk, (-1, 0, rows))
            if end > rows or (expert < 0 and disk in layout.slices):
                raise bad_input(f"the adapter trains {param}, whose checkpoint tensor {disk} is not one expert's rows "
                                "of it", "export format adapter instead")
            out[disk] = AdaptedModule(module, disk, "experts", roles["A"], roles["B"], None, scaling,
                                      expert=expert, rows=(first, end), experts=experts)
        return out

    def _scaling(self, module: str, rank: int) -> float:
        """peft's LoraLayer.update_layer: alpha / r (rsLoRA: alpha / sqrt(r)), per-module patterns first."""
        from peft.utils.other import get_pattern_key

        alphas = self.config.get("alpha_pattern") or {}
        alpha = alphas.get(get_pattern_key(alphas.keys(), module), self.config.get("lora_alpha", 8))
        return alpha / math.sqrt(rank) if self.config.get("use_rslora") else alpha / rank

    def delta(self, adapted: AdaptedModule) -> torch.Tensor:
        """B @ A * scaling in fp32 (peft's get_delta_weight), in the module's Linear orientation (out, in);
        embeddings in their own (num, dim)."""
        if adapted.kind == "experts":
            return self._expert_delta(adapted)
        a = self.files.get(adapted.a_key).float()
        b = self.files.get(adapted.b_key).float()
        product = b @ a
        if adapted.kind == "embedding":
            product = product.T
        return product.mul_(adapted.scaling)

    def _expert_delta(self, adapted: AdaptedModule) -> torch.Tensor:
        """peft's ParamWrapper.get_delta_weight for one expert's rows (all experts for a fused disk tensor):
        A's rows are (expert, rank), B's columns (rank, expert)."""
        if adapted.a_key not in self._factors:
            if len(self._factors) >= 2:  # the writers take a layer's experts in turn: two wrappers at most
                self._factors.pop(next(iter(self._factors)))
            a, b = self.files.get(adapted.a_key).float(), self.files.get(adapted.b_key).float()
            self._factors[adapted.a_key] = (a.reshape(adapted.experts, -1, a.shape[-1]),
                                            b.reshape(b.shape[0], -1, adapted.experts))
        a, b = self._factors[adapted.a_key]
        product = torch.einsum("ore,eri->eoi", b, a) if adapted.expert < 0 else b[:, :, adapted.expert] @ a[adapted.expert]
        first, end = adapted.rows
        return product[..., first:end, :].mul(adapted.scaling)

    def magnitude(self, adapted: AdaptedModule) -> torch.Tensor:
        return self.files.get(adapted.magnitude_key).float()
