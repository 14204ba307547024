"""Where things live: bundled resources and the user's data directory. Torch-free."""

from __future__ import annotations

import os
from pathlib import Path

from platformdirs import user_data_path

BUNDLED_PREFIX = "bundled:"


def resources_dir() -> Path:
    """The `resources/` folder shipped beside the packages (override: FINETUNE_STUDIO_RESOURCES)."""
    override = os.environ.get("FINETUNE_STUDIO_RESOURCES")
    if override:
        return Path(override)
    return Path(__file__).resolve().parent.parent / "resources"


def resolve_resource(path: str) -> Path:
    """Turn `bundled:tiny` into the bundled folder; any other path is expanded as given."""
    if path.startswith(BUNDLED_PREFIX):
        return resources_dir() / path[len(BUNDLED_PREFIX):]
    return Path(path).expanduser()


def studio_home() -> Path:
    """Root of runs and the run index (override: FINETUNE_STUDIO_HOME)."""
    override = os.environ.get("FINETUNE_STUDIO_HOME")
    root = Path(override).expanduser() if override else user_data_path("finetune-studio", appauthor=False)
    return root


def runs_dir() -> Path:
    return studio_home() / "runs"
