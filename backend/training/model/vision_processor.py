"""load_vision_processor(): a vision-language folder's processor, without torchvision.

Our CPU torch has no torchvision beside it. transformers 5.25's AutoImageProcessor then picks the
Pillow class the folder's `image_processor_type` names (`Qwen2VLImageProcessor` ->
`Qwen2VLImageProcessorPil`), so LLaVA, LLaVA-NeXT, Gemma 3, Idefics3 and Mllama load through
AutoProcessor as they are. The processors that also take a video processor (Qwen2.5-VL, Qwen3-VL,
Qwen3.5, Gemma 4) cannot be built at all: transformers checks the video processor's class, which it
does not define without torchvision. For those this builds the family's own processor class with the
video processor left out; images and text go through the family's code unchanged, a video is refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from backend.core.errors import bad_input
from backend.core.vision_folder import VisionFolder

WITH_VIDEO = {"qwen2_5_vl": "Qwen2_5_VLProcessor", "qwen3_vl": "Qwen3VLProcessor", "qwen3_5": "Qwen3VLProcessor",
              "gemma4": "Gemma4Processor"}
"""Family key -> its transformers processor, for the families whose processor takes a video processor."""


def image_only(processor_name: str) -> type:
    """The transformers processor `processor_name`, taking `video_processor=None`."""
    import transformers

    base = getattr(transformers, processor_name)

    def check_argument_for_proper_class(self, argument_name: str, argument: Any):
        if argument_name == "video_processor" and argument is None:
            return None
        return base.check_argument_for_proper_class(self, argument_name, argument)

    return type(f"ImageOnly{processor_name}", (base,), {"check_argument_for_proper_class": check_argument_for_proper_class})


def load_vision_processor(folder: Path) -> Any:
    """The processor of a proven family's folder; one line naming the folder when it cannot be read."""
    from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer

    folder = Path(folder)
    vision = VisionFolder.read(folder)
    if vision.family is None:
        raise bad_input(vision.refusal or f"{folder}: not a vision-language model folder",
                        "pick a folder of a proven vision-language family")
    if not vision.processor_files:
        raise bad_input(f"{folder}: no preprocessor_config.json or processor_config.json, so the image "
                        "processor's settings are unknown", "copy the model's processor files into the folder")
    if vision.family.key not in WITH_VIDEO:
        return AutoProcessor.from_pretrained(folder)
    kwargs: dict[str, Any] = {"video_processor": None}
    if vision.family.key == "gemma4":  # its audio side at the defaults: numpy only, an image never reaches it
        from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor

        kwargs["feature_extractor"] = Gemma4AudioFeatureExtractor()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    return image_only(WITH_VIDEO[vision.family.key])(
        image_processor=AutoImageProcessor.from_pretrained(folder), tokenizer=tokenizer,
        chat_template=getattr(tokenizer, "chat_template", None), **kwargs)
