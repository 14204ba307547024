"""fetch_model_config(): a hub model's config.json alone, so its estimate shows before its weights are pulled.

Only when a person asks (`finetune-studio estimate --fetch-config`, the Model page's "Fetch config.json"
button): the file lands in the model's download folder (backend.core.paths.hub_folder) with
huggingface_hub's metadata beside it, so the full download later finds it there and does not fetch it
again. Such a folder estimates; Start waits for the weights (feasibility.input_verdicts). Torch-free.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from backend.core.paths import HUB_PREFIX, hub_folder

OFFLINE_WORDS = ("1", "true", "yes", "on")
"""HF_HUB_OFFLINE values huggingface_hub itself reads as offline."""


def hub_offline_reason() -> str:
    """Why the Hub may not be asked from here ("" when it may): HF_HUB_OFFLINE, or no huggingface_hub."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in OFFLINE_WORDS:
        return "offline: HF_HUB_OFFLINE is set, so downloads are off (unset it to enable them)"
    try:
        import huggingface_hub  # noqa: F401  (a transformers dependency; checked, not assumed)
    except ImportError:
        return "offline: huggingface_hub is not installed, so downloads are off"
    return ""


def fetch_model_config(path: str, endpoint: str | None = None) -> Path:
    """config.json of the `hub:ORG/NAME` model `path`, fetched into its download folder unless it is
    there already; raises ValueError in one line (offline, not a hub path, no such model, no network)."""
    if not path.startswith(HUB_PREFIX):
        raise ValueError(f"model.path {path}: only a hub:ORG/NAME model is fetched; a local folder is read as it is")
    repo = path[len(HUB_PREFIX):]
    folder = hub_folder(repo)
    if (folder / "config.json").is_file():
        return folder / "config.json"
    offline = hub_offline_reason()
    if offline:
        raise ValueError(f"cannot fetch {repo}'s config.json: {offline}")
    from huggingface_hub import hf_hub_download

    existed = folder.exists()
    try:
        return Path(hf_hub_download(repo, "config.json", local_dir=folder, endpoint=endpoint))
    except Exception as exc:  # one line for the person, never a traceback
        if not existed:  # an empty folder would read as "downloaded, no config.json"
            shutil.rmtree(folder, ignore_errors=True)
        raise ValueError(f"cannot fetch {repo}'s config.json: {_why(exc, endpoint)}") from None


def _why(exc: BaseException, endpoint: str | None) -> str:
    """The cause people meet, in words: no such model, gated, or no network."""
    from huggingface_hub import constants
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    where = endpoint or constants.ENDPOINT
    if isinstance(exc, GatedRepoError):
        return "the model is gated: accept its licence on its Hub page and log in (`hf auth login`)"
    if isinstance(exc, RepositoryNotFoundError):
        return f"no such model on {where} (or it is private: log in with `hf auth login`); check the spelling"
    if isinstance(exc, HfHubHTTPError):
        return f"{where} answered with an error: {str(exc).splitlines()[0]}"
    name = type(exc).__name__
    if "Connect" in name or "Timeout" in name or "LocalEntryNotFound" in name or isinstance(exc, OSError):
        return f"could not reach {where}: check the network (or HF_ENDPOINT)"
    return f"{name}: {str(exc).splitlines()[0] if str(exc) else ''}"
