"""The SFT door of a proven vision-language folder: the model, the processor, the rows, the collator, the
trainer. backend/jobs/finetune.py takes it instead of the text door when the folder is a VLM; one_step()
builds the same model and one batch for a config, for the memory estimate's measurements.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from backend.core.config.run_config import RunConfig
from backend.core.errors import bad_input
from backend.core.data.examples import DatasetReader
from backend.core.registries.vision_families import VisionFamily, takes_image_door
from backend.core.vision_folder import VisionFolder
from backend.runtime.hub_kernels import LOAD_KWARGS
from backend.training.counting_trainer import SupervisedCountingTrainer
from backend.training.model.loading import check_lora_rank, check_model_folder, rank_device
from backend.training.model.techniques import TechniquePlan
from backend.training.model.vision_processor import WITH_VIDEO, load_vision_processor
from backend.training.shortcuts.installer import attention_implementation
from backend.training.vision import parts
from backend.training.vision.collator import VisionCollator
from backend.training.vision.packed_collator import PackedVisionCollator, rope_index_of
from backend.training.vision.rows import ImageRows, build_image_datasets

log = logging.getLogger(__name__)


@dataclass
class VisionRun:
    """One VLM folder read for training: its family, config.json and processor (the cap applied)."""

    folder: Path
    family: VisionFamily
    config: dict[str, Any]
    processor: Any

    @classmethod
    def open(cls, folder: Path, config: RunConfig) -> "VisionRun":
        parts.tuning(config)  # a lora part under method full is refused before anything loads
        vision = VisionFolder.read(folder)
        if vision.family is None:
            raise bad_input(vision.refusal or f"{folder}: not a vision-language model folder",
                            "pick a model of a proven family (docs/architecture.md, Vision-language models)")
        processor = load_vision_processor(folder)
        processor.tokenizer.padding_side = "right"
        if processor.tokenizer.pad_token_id is None:
            processor.tokenizer.pad_token = processor.tokenizer.eos_token
        apply_cap(processor, vision.family, config.vision.max_pixels)
        return cls(Path(folder), vision.family, vision.config, processor)

    @property
    def image_token_id(self) -> int | None:
        return self.family.image_token_id(self.config)

    def build_datasets(self, config: RunConfig):
        """-> (train, validation or None, DataStats, ImageRows)."""
        return build_image_datasets(config, self.processor, self.family, self.config, {})

    def collator(self, rows: ImageRows, packed_for: Any = None) -> VisionCollator | PackedVisionCollator:
        """Padded batches; packed ones (the `packed_image_rows` shortcut) given the model whose M-RoPE
        positions each row takes."""
        padded = VisionCollator(self.processor, rows)
        return padded if packed_for is None else PackedVisionCollator(padded, rope_index_of(packed_for))

    def save_pretrained(self, folder: Path | str, **kwargs: Any) -> None:
        """The processor beside the adapter or model, as the folder had it: a processor built without its
        video half (vision_processor.py) cannot save itself whole, so its tokenizer and image processor go."""
        if self.family.key in WITH_VIDEO:
            self.processor.image_processor.save_pretrained(folder)
            self.processor.tokenizer.save_pretrained(folder)
        else:
            self.processor.save_pretrained(folder)


def takes_door(folder: Path, config: RunConfig) -> bool:
    """Whether this run trains through this door (core's takes_image_door): a proven VLM's, unless its
    family trains text rows on the text path (Gemma 3) and neither its data nor its tuned parts need images.
    The data is read for such a family only, its images checked by their headers."""
    vision = VisionFolder.read(folder)
    if vision.family is None:
        return False
    if not vision.family.text_door:
        return True
    reader = DatasetReader(config.resolved_data_path(), config.data.format, config.data.skip_invalid,
                           config.data.max_examples, max_images=None, check_pixels=False)
    images = 1 if any(example.images for example in reader.examples()) else 0
    return takes_image_door(vision.config, config.vision.tower, config.vision.projector, images)


def apply_cap(processor: Any, family: VisionFamily, max_pixels: int | None) -> None:
    """vision.max_pixels as the family's cap: Qwen's `size.longest_edge` (pixels) and `max_pixels`.
    Families with another kind of cap (a fixed square, a tile edge, a token budget) keep their own."""
    if max_pixels is None:
        return
    if family.cap_key != "max_pixels":
        log.info("vision.max_pixels is not %s's cap (%s); the processor's own setting stays", family.label,
                 family.cap_key)
        return
    image = processor.image_processor
    size = dict(getattr(image, "size", None) or {})
    size["longest_edge"] = max_pixels
    image.size = size
    if hasattr(image, "max_pixels"):
        image.max_pixels = max_pixels


def load_vision_model(path: Path, config: RunConfig, plan: TechniquePlan, family: VisionFamily) -> Any:
    """AutoModelForImageTextToText in the plan's dtype; QLoRA/LoRA8 quantize the language model only."""
    from transformers import AutoModelForImageTextToText

    kwargs: dict[str, Any] = {}
    quantization = quantization_config(config, plan, family)
    if quantization is not None:
        kwargs["quantization_config"] = quantization
        kwargs["device_map"] = {"": rank_device(plan.device)}
    model = AutoModelForImageTextToText.from_pretrained(
        path, dtype=plan.load_dtype, trust_remote_code=config.model.trust_remote_code,
        use_safetensors=not config.model.allow_pickle, attn_implementation=attention_implementation(plan),
        **LOAD_KWARGS, **kwargs)
    for section in (model.config, model.config.get_text_config()):  # the text model reads its own section's
        section.use_cache = False
    return model if plan.quantization else model.to(rank_device(plan.device))


def quantization_config(config: RunConfig, plan: TechniquePlan, family: VisionFamily) -> Any:
    """The BitsAndBytesConfig of a QLoRA/LoRA8 run, the tower and projector in its skip list; None otherwise."""
    from transformers import BitsAndBytesConfig

    skip = parts.skip_quantization(family)
    if plan.quantization == "nf4":
        return BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=plan.load_dtype if plan.precision != "fp32" else torch.float32,
            llm_int8_skip_modules=skip)
    if plan.quantization == "int8":
        return BitsAndBytesConfig(load_in_8bit=True, llm_int8_skip_modules=skip)
    return None


def add_vision_adapters(model: Any, config: RunConfig, plan: TechniquePlan, family: VisionFamily) -> Any:
    """LoRA/DoRA on the language model (and on the tower/projector where vision says lora), the `full`
    parts trainable and saved with the adapter; for method full, the parts as vision says."""
    if config.technique.method != "full":
        from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

        if plan.quantization:
            model = parts.keep_image_side_dtype(
                model, family, config, lambda m: prepare_model_for_kbit_training(m, use_gradient_checkpointing=False))
        technique = config.technique
        lora = LoraConfig(r=technique.lora_rank, lora_alpha=technique.lora_alpha, lora_dropout=technique.lora_dropout,
                          target_modules=parts.lora_targets(model, family, config),
                          modules_to_save=parts.saved_modules(model, family, config) or None,
                          use_dora=technique.method == "dora", task_type="CAUSAL_LM")
        model = get_peft_model(model, lora)
        check_lora_rank(model, config)
    counts = parts.set_trainable(model, family, config)
    log.info("trainable parameters by part: %s", ", ".join(f"{k} {v:,}" for k, v in counts.items()))
    return model


def make_trainer(model: Any, args: Any, train_set: Any, eval_set: Any, collator: Any, callbacks: list[Any],
                 image_token_id: int | None) -> SupervisedCountingTrainer:
    """The counting trainer, told the image token so it reports image rows and tokens seen."""
    trainer = SupervisedCountingTrainer(model=model, args=args, train_dataset=train_set, eval_dataset=eval_set,
                                        data_collator=collator, callbacks=callbacks)
    trainer.image_token_id = image_token_id
    return trainer


def one_step(config: RunConfig, plan: TechniquePlan) -> tuple[Any, dict[str, torch.Tensor]]:
    """The model a VLM run trains (adapters on, parts frozen as configured) and its first batch of
    micro_batch_size rows (packed where the plan packs image rows), on the plan's device: what a memory
    measurement runs forward and backward."""
    folder = check_model_folder(config)
    run = VisionRun.open(folder, config)
    train, _, _, rows = run.build_datasets(config)
    model = add_vision_adapters(load_vision_model(folder, config, plan, run.family), config, plan, run.family)
    collator = run.collator(rows, model if plan.shortcuts.has("packed_image_rows") else None)
    batch = collator([train[i] for i in range(min(len(train), config.train.micro_batch_size))])
    device = next(model.parameters()).device
    return model, {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
