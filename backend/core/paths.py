"""Where things live: bundled resources and the user's data directory. Torch-free."""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path

from platformdirs import user_data_path

BUNDLED_PREFIX = "bundled:"
HUB_PREFIX = "hub:"
"""`hub:ORG/NAME` names a hub model by id: the folder the Model page downloads it into."""


BESIDE = Path(__file__).resolve().parent.parent.parent / "resources"
"""Where a checkout (`pip install -e .`) and the PyInstaller bundle keep `resources/`."""
SHARED = Path("share") / "finetune-studio" / "resources"
"""Where a wheel (`pip install .`) puts it, under the environment's (or the user's) data prefix."""


def resources_dir() -> Path:
    """The bundled `resources/` folder (override: FINETUNE_STUDIO_RESOURCES)."""
    override = os.environ.get("FINETUNE_STUDIO_RESOURCES")
    if override:
        return Path(override)
    if BESIDE.is_dir():
        return BESIDE
    for scheme in (sysconfig.get_default_scheme(), sysconfig.get_preferred_scheme("user")):
        installed = Path(sysconfig.get_path("data", scheme)) / SHARED
        if installed.is_dir():
            return installed
    return BESIDE  # missing everywhere: errors then name the checkout's path


def resolve_resource(path: str) -> Path:
    """Turn `bundled:tiny` into the bundled folder and `hub:ORG/NAME` into its download folder; any
    other path is expanded as given."""
    if path.startswith(BUNDLED_PREFIX):
        return resources_dir() / path[len(BUNDLED_PREFIX):]
    if path.startswith(HUB_PREFIX):
        return hub_folder(path[len(HUB_PREFIX):])
    return Path(path).expanduser()


def not_downloaded(path: str) -> str | None:
    """The one-line error for a `hub:` model path whose download folder is not there yet, else None."""
    if not path.startswith(HUB_PREFIX) or resolve_resource(path).exists():
        return None
    repo, folder = path[len(HUB_PREFIX):], resolve_resource(path)
    return (f"model.path {path} is not downloaded yet ({folder}): download it on the Model page, "
            f"or run `hf download {repo} --local-dir {folder}`")


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt")
"""Files that hold weights (backend/training/model/model_check.py judges which may load)."""


def has_weight_files(folder: Path) -> bool:
    """Whether `folder` holds a weights file (safetensors, or pickle ones model.allow_pickle admits): a
    folder with config.json alone (fetched to estimate before a download) estimates but cannot train."""
    try:
        return any(p.suffix in WEIGHT_SUFFIXES and "training_args" not in p.name for p in folder.iterdir())
    except OSError:
        return False


def studio_home() -> Path:
    """Root of runs and the run index (override: FINETUNE_STUDIO_HOME)."""
    override = os.environ.get("FINETUNE_STUDIO_HOME")
    root = Path(override).expanduser() if override else user_data_path("finetune-studio", appauthor=False)
    return root


def usable_home() -> Path:
    """The studio home, created if missing; one that cannot be (a file, inside a file, not writable)
    is a bad-input JobError naming it and the fix, not an OSError deep inside a command."""
    from backend.core.errors import bad_input

    root = studio_home()
    override = os.environ.get("FINETUNE_STUDIO_HOME")
    fix = ("point FINETUNE_STUDIO_HOME at a folder you can write, or unset it" if override else
           "check its permissions, or set FINETUNE_STUDIO_HOME to a folder you can write")
    named = f"FINETUNE_STUDIO_HOME={override}" if override else f"the data directory {root}"
    blocker = next((p for p in (root, *root.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        where = "is a file" if blocker == root else f"is inside a file ({blocker})"
        raise bad_input(f"{named} {where}, not a folder", fix)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise bad_input(f"{named} cannot be created ({exc.strerror or exc})", fix) from None
    if not os.access(root, os.W_OK | os.X_OK):
        raise bad_input(f"{named} cannot be written (permission denied)", fix)
    return root


def runs_dir() -> Path:
    return studio_home() / "runs"


def models_dir() -> Path:
    """Where hub downloads land, one folder per model."""
    return studio_home() / "models"


def hub_folder(repo_id: str) -> Path:
    """Where a hub id lands: <studio home>/models/<org>--<name>, the Hub cache's own naming."""
    return models_dir() / repo_id.strip().replace("/", "--")
