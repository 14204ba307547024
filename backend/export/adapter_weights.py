"""AdapterWeights: a saved peft LoRA/DoRA adapter, matched to the base checkpoint's tensors.

peft saves one `lora_A`/`lora_B` pair (and, for DoRA, a `lora_magnitude_vector`) per adapted module,
keyed by the in-memory module name under `base_model.model.`. Each is matched here to the disk tensor
it changes (through ModelLayout) with its own scaling: lora_alpha / r, or lora_alpha / sqrt(r) for
rsLoRA, with peft's rank_pattern / alpha_pattern overrides. Anything this merge does not reproduce
exactly (LoRA biases, modules_to_save, adapters on fused MoE experts, other peft methods) is refused
in one sentence rather than merged approximately.
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
    kind: str  # linear | conv1d | embedding
    a_key: str
    b_key: str
    magnitude_key: str | None
    scaling: float


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
        if self.config.get("modules_to_save"):
            raise bad_input(f"{config_path}: modules_to_save {self.config['modules_to_save']} holds full copies of "
                            "layers, which this merge does not write", "export format adapter instead")
        if self.config.get("lora_bias"):
            raise bad_input(f"{config_path}: lora_bias adapters are not merged here", "export format adapter instead")
        self.files = CheckpointFiles(self.folder)
        self.use_dora = bool(self.config.get("use_dora"))
        parts: dict[str, dict[str, str]] = {}
        for key in self.files.names():
            body = key[len(PREFIX):] if key.startswith(PREFIX) else key
            role = next(((suffix, r) for suffix, r in ROLES.items() if body.endswith(suffix)), None)
            if role is None:
                raise bad_input(f"{self.folder / 'adapter_model.safetensors'}: key {key} is not a LoRA weight this "
                                "merge knows", "export format adapter instead")
            suffix, name = role
            parts.setdefault(body[: -len(suffix)], {})[name] = key
        self.modules: dict[str, AdaptedModule] = {}
        for module, roles in sorted(parts.items()):
            self.modules.update(self._match(module, roles, layout))

    def _match(self, module: str, roles: dict[str, str], layout: ModelLayout) -> dict[str, AdaptedModule]:
        owner = layout.fused_owner(module.removesuffix(".base_layer"))
        if owner is not None or module.endswith(".base_layer"):
            raise bad_input(f"the adapter trains the fused MoE experts {owner or module} (peft ParamWrapper), which "
                            "export cannot merge yet", "export format adapter, or train with lora_targets that "
                            "leave the experts out (e.g. q_proj,k_proj,v_proj,o_proj)")
        if "A" not in roles or "B" not in roles:
            raise bad_input(f"{self.folder}: module {module} has {sorted(roles)} but not both lora_A and lora_B")
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

    def _scaling(self, module: str, rank: int) -> float:
        """peft's LoraLayer.update_layer: alpha / r (rsLoRA: alpha / sqrt(r)), per-module patterns first."""
        from peft.utils.other import get_pattern_key

        alphas = self.config.get("alpha_pattern") or {}
        alpha = alphas.get(get_pattern_key(alphas.keys(), module), self.config.get("lora_alpha", 8))
        return alpha / math.sqrt(rank) if self.config.get("use_rslora") else alpha / rank

    def delta(self, adapted: AdaptedModule) -> torch.Tensor:
        """B @ A * scaling in fp32 (peft's get_delta_weight), in the module's Linear orientation (out, in);
        embeddings in their own (num, dim)."""
        a = self.files.get(adapted.a_key).float()
        b = self.files.get(adapted.b_key).float()
        product = b @ a
        if adapted.kind == "embedding":
            product = product.T
        return product.mul_(adapted.scaling)

    def magnitude(self, adapted: AdaptedModule) -> torch.Tensor:
        return self.files.get(adapted.magnitude_key).float()
