"""model.adapter's loader: an earlier run's LoRA/DoRA adapter on the loaded base, trainable (needs peft).

The torch-free check of the folder against technique is backend.core.runs.start_adapter.start_adapter_folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from backend.core.errors import bad_input


def load_start_adapter(model: Any, folder: Path) -> Any:
    """`model` with the adapter in `folder`, trainable; a base it does not fit is refused in one line."""
    from peft import PeftModel

    base_path = getattr(model, "name_or_path", None)
    try:
        wrapped = PeftModel.from_pretrained(model, str(folder), is_trainable=True)
        if base_path:  # the saved adapter names the base it trained on, not where the start adapter came from
            wrapped.peft_config["default"].base_model_name_or_path = base_path
        return wrapped
    except (RuntimeError, ValueError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise bad_input(f"model.adapter: {folder} does not fit model.path's model ({first})",
                        "start from an adapter trained on the same base model") from None
