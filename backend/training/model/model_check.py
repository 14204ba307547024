"""The model folder's files checked before a weight loads: each fault one line naming the file and the fix.

config.json (a model type transformers has a causal LM for, positive whole-number sizes, none of the
dimensions its family needs left out), the code
an auto_map names (when trust_remote_code is ticked), tokenizer.json and tokenizer_config.json (JSON,
and token ids the embedding has rows for), and the safetensors weights: every shard the index names
present, each file's header read (never its tensors) and its size matching what the header declares,
and the embedding's rows matching config.json's vocab_size. A download cut short, a Git LFS pointer
left by a clone without LFS, or files from two models in one folder fail here and not as a traceback.
Stdlib only, but for transformers' table of model types (imported when a config is checked).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from backend.core.config.run_config import RunConfig
from backend.core.vision_folder import VisionFolder
from backend.core.errors import bad_input
from backend.core.paths import not_downloaded

FIX_CONFIG = "copy config.json unchanged from the model's Hugging Face repository"
FIX_DOWNLOAD = "download the file again (an interrupted download leaves it short)"
INDEX = "model.safetensors.index.json"
LFS = b"version https://git-lfs"
MAX_HEADER = 100_000_000
"""safetensors' own limit on a header's length: beyond it the file is not safetensors."""
SIZES = ("hidden_size", "n_embd", "d_model", "num_hidden_layers", "n_layer", "num_attention_heads", "n_head",
         "vocab_size", "intermediate_size", "n_inner", "num_key_value_heads", "head_dim", "max_position_embeddings")
MAY_BE_NULL = {"n_inner", "num_key_value_heads", "head_dim", "intermediate_size", "max_position_embeddings"}
DIMENSIONS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "intermediate_size")
"""Sizes that shape the weights: one a config.json leaves out is filled from the config class's default,
and the weights then do not fit (transformers' raw "ignore_mismatched_sizes" error)."""
EMBEDDINGS = ("embed_tokens.weight", "wte.weight", "embed_in.weight", "word_embeddings.weight",
              "tok_embeddings.weight")


def read_json(file: Path, fix: str = FIX_CONFIG) -> Any:
    """A JSON file of the folder, or the one line that says why it cannot be read."""
    raw = file.read_bytes()
    if not raw.strip():
        raise bad_input(f"{file}: the file is empty", fix)
    if raw.startswith(LFS):
        raise bad_input(f"{file}: a Git LFS pointer, not the file itself", "run git lfs pull in the model folder")
    if raw.startswith(b"\xef\xbb\xbf"):
        raise bad_input(f"{file}: starts with a byte-order mark, which transformers cannot read",
                        "re-save it as UTF-8 without a BOM")
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise bad_input(f"{file}: not UTF-8 text", fix) from None
    except json.JSONDecodeError as exc:
        raise bad_input(f"{file}: not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})", fix) from None


def read_config(file: Path) -> dict[str, Any]:
    config = read_json(file)
    if not isinstance(config, dict):
        raise bad_input(f"{file}: expected a JSON object, got {type(config).__name__}", FIX_CONFIG)
    return config


def check_files(path: Path, config: dict[str, Any], trust_remote_code: bool, allow_pickle: bool) -> None:
    """Every check after the folder's layout is known to be a model's (backend.training.model.loading)."""
    config_file = path / "config.json"
    _model_type(config_file, config, trust_remote_code)
    own_code = bool(config.get("auto_map")) and trust_remote_code  # its own code gives its sizes their meaning
    if not own_code and not isinstance(config.get("text_config"), dict):  # a multimodal one nests its sizes
        _dimensions(config_file, config)
    for part in (config, config.get("text_config")):
        if isinstance(part, dict) and not own_code:
            _sizes(config_file, part)
    tokenizer_config = _tokenizer_config(path)
    if trust_remote_code:
        _remote_code(config_file, config.get("auto_map"))
        _remote_code(path / "tokenizer_config.json", tokenizer_config.get("auto_map"))
    elif tokenizer_config.get("auto_map"):
        raise bad_input(f"{path / 'tokenizer_config.json'}: the tokenizer needs code shipped with the model "
                        "(auto_map)", "tick model.trust_remote_code only if you trust its author")
    top_id = _tokenizer(path)
    _weights(path, config, allow_pickle, top_id)


def known_families() -> list[str]:
    """The model types the studio measures (memory estimate) or writes (GGUF export)."""
    from backend.estimate.families import ESTIMATE_FAMILIES
    from backend.core.registries.export_formats import GGUF_ARCHITECTURES

    return sorted(set(ESTIMATE_FAMILIES) | set(GGUF_ARCHITECTURES))


def _model_type(file: Path, config: dict[str, Any], trust_remote_code: bool) -> None:
    if config.get("auto_map") and trust_remote_code:
        return  # the model's own code defines its type
    model_type = config.get("model_type")
    families = ", ".join(known_families())
    if not model_type:
        raise bad_input(f"{file}: no model_type, so transformers cannot tell which model this is "
                        f"(the studio knows {families})", f"add the model_type; {FIX_CONFIG}")
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING_NAMES:
        raise bad_input(f"{file}: model_type {model_type!r} is not a model type transformers "
                        f"{transformers.__version__} knows; the studio knows {families}",
                        "fix model_type in config.json, or upgrade transformers if the model is newer than it")
    vision = VisionFolder.from_config(config, file.parent)
    if vision.refusal:
        raise bad_input(vision.refusal, "pick a model of a proven family (docs/architecture.md, Vision-language models)")
    if vision.family is not None:
        return  # a proven VLM trains through AutoModelForImageTextToText (backend/training/vision)
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise bad_input(f"{file}: model_type {model_type!r} has no causal language model in transformers "
                        f"(an encoder or encoder-decoder model); the studio fine-tunes decoders such as {families}",
                        "pick a causal (decoder-only) language model")


def _dimensions(file: Path, config: dict[str, Any]) -> None:
    """Each of DIMENSIONS the family's config class has (and does not derive: a None default) is in the file,
    under its own name or the family's (attribute_map: GPT-2's n_embd for hidden_size)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    try:
        family = CONFIG_MAPPING[config["model_type"]]
        defaults = family()
    except Exception:  # a class that cannot be built bare: transformers' own load will speak for it
        return
    aliases = getattr(family, "attribute_map", None) or {}
    for key in DIMENSIONS:
        default = getattr(defaults, key, None)
        if default is None or isinstance(default, bool) or not isinstance(default, int):
            continue
        name = aliases.get(key, key)
        if name not in config and key not in config:
            called = f" ({family.__name__}'s name for {key})" if name != key else ""
            raise bad_input(f"{file}: {name} is missing{called}; transformers would fill in {family.__name__}'s "
                            f"default {name}={default} instead of this model's own size",
                            f"add {name} to config.json; {FIX_CONFIG}")


def _sizes(file: Path, config: dict[str, Any]) -> None:
    for key in SIZES:
        if key not in config or (config[key] is None and key in MAY_BE_NULL):
            continue
        value = config[key]
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            shown = "null" if value is None else repr(value)
            raise bad_input(f"{file}: {key} is {shown}, not a positive whole number", FIX_CONFIG)


def _tokenizer_config(path: Path) -> dict[str, Any]:
    file = path / "tokenizer_config.json"
    if not file.is_file():
        return {}
    config = read_json(file, "copy tokenizer_config.json unchanged from the model's repository")
    if not isinstance(config, dict):
        raise bad_input(f"{file}: expected a JSON object, got {type(config).__name__}",
                        "copy tokenizer_config.json unchanged from the model's repository")
    return config


def _remote_code(file: Path, auto_map: Any) -> None:
    """Each module an auto_map names lies in the folder (a `repo--module.Class` lives in another repo)."""
    if not isinstance(auto_map, dict):
        return
    for target in auto_map.values():
        for reference in target if isinstance(target, list) else [target]:
            if not isinstance(reference, str) or "--" in reference or "." not in reference:
                continue
            module = reference.rsplit(".", 1)[0].replace(".", "/") + ".py"
            if not (file.parent / module).is_file():
                raise bad_input(f"{file}: auto_map names {reference}, but {module} is not in the model folder",
                                f"copy {module} from the model's repository into {file.parent}")


def _tokenizer(path: Path) -> int | None:
    """The largest token id tokenizer.json holds (None without one), once it is known to be JSON."""
    file = path / "tokenizer.json"
    if not file.is_file():
        return None
    tokenizer = read_json(file, "copy tokenizer.json unchanged from the model's repository")
    if not isinstance(tokenizer, dict) or not isinstance(tokenizer.get("model"), dict):
        raise bad_input(f"{file}: not a tokenizer (no 'model' object)",
                        "copy tokenizer.json unchanged from the model's repository")
    vocab = tokenizer["model"].get("vocab")
    ids = [value for value in vocab.values() if isinstance(value, int)] if isinstance(vocab, dict) else []
    top = max(ids, default=(len(vocab) - 1) if isinstance(vocab, list) else -1)  # Unigram: a list of pieces
    added = [t.get("id") for t in tokenizer.get("added_tokens") or [] if isinstance(t, dict)]
    return max([top] + [i for i in added if isinstance(i, int)])


EXTRA_EMBEDDING_ROWS = {"mllama": 8}
"""Embedding rows a family holds beyond vocab_size: Mllama's text model builds vocab_size + 8
(modeling_mllama.MllamaTextModel), so Llama 3.2 Vision's 128,264 rows stand beside vocab_size 128,256."""


def _weights(path: Path, config: dict[str, Any], allow_pickle: bool, top_id: int | None) -> None:
    files, weight_map = _weight_files(path, allow_pickle)
    headers = {file.name: read_header(file) for file in files}
    for name, shard in weight_map.items():
        if shard in headers and name not in headers[shard]:
            raise bad_input(f"{path / INDEX}: maps {name} to {shard}, which does not hold it", FIX_DOWNLOAD)
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    vocab = text.get("vocab_size", config.get("vocab_size"))
    extra = EXTRA_EMBEDDING_ROWS.get(str(config.get("model_type")), 0)
    for file, name, rows in _embeddings(headers):
        if isinstance(vocab, int) and vocab + extra != rows:
            raise bad_input(f"{path / file}: {name} has {rows} rows, but config.json says vocab_size {vocab}",
                            "set vocab_size to the embedding's rows in config.json, or take config.json and the "
                            "weights from the same model")
        if top_id is not None and top_id >= rows:
            raise bad_input(f"{path / 'tokenizer.json'}: token ids go up to {top_id}, but the embedding ({file}) "
                            f"has {rows} rows", "use the tokenizer that came with these weights")
        return  # the first text embedding is the one


def _embeddings(headers: dict[str, dict[str, Any]]) -> list[tuple[str, str, int]]:
    """(file, tensor, rows) of the token embeddings the headers hold; a vision tower's are left out."""
    found = []
    for file, header in headers.items():
        for name, entry in header.items():
            if not name.endswith(EMBEDDINGS) or any(t in name for t in ("vision", "visual", "audio")):
                continue
            shape = entry.get("shape") if isinstance(entry, dict) else None
            if isinstance(shape, list) and len(shape) == 2 and isinstance(shape[0], int):
                found.append((file, name, shape[0]))  # a quantized (packed) embedding is not 2-D [rows, width]
    return found


def _weight_files(path: Path, allow_pickle: bool) -> tuple[list[Path], dict[str, str]]:
    """The safetensors files transformers would load (model.safetensors, or the shards the index
    names) and the index's weight_map ({} without an index)."""
    index = path / INDEX
    if index.is_file():
        data = read_json(index, FIX_DOWNLOAD)
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise bad_input(f"{index}: no weight_map object", FIX_DOWNLOAD)
        shards = sorted({shard for shard in weight_map.values() if isinstance(shard, str)})
        missing = [shard for shard in shards if not (path / shard).is_file()]
        if missing:
            raise bad_input(f"{index}: names {', '.join(missing)}, not in the folder ({len(missing)} of {len(shards)} "
                            "shards missing)", "download the missing shards again")
        return [path / shard for shard in shards], weight_map
    if (path / "model.safetensors").exists():
        return [path / "model.safetensors"], {}
    others = sorted(p.name for p in path.glob("*.safetensors"))
    if any(name.startswith("model-") and "-of-" in name for name in others):
        raise bad_input(f"{path / others[0]}: sharded weights without {INDEX}, which says which shard holds what",
                        f"download {INDEX} from the model's repository into the folder")
    if "adapter_model.safetensors" in others:
        raise bad_input(f"{path / 'adapter_model.safetensors'}: this folder is a LoRA adapter, not a model",
                        "point model.path at the base model (adapter_config.json names it), or export the run merged")
    if others and not allow_pickle:
        raise bad_input(f"{path}: no model.safetensors (only {', '.join(others)}), so transformers finds no weights",
                        "rename the weights file to model.safetensors")
    return [], {}


def read_header(file: Path) -> dict[str, Any]:
    """A safetensors file's header (names, dtypes, shapes, offsets), its size checked against it."""
    size = file.stat().st_size
    if size == 0:
        raise bad_input(f"{file}: the file is empty", FIX_DOWNLOAD)
    with file.open("rb") as handle:
        if handle.read(len(LFS)) == LFS:
            raise bad_input(f"{file}: a Git LFS pointer, not the weights", "run git lfs pull in the model folder")
        handle.seek(0)
        head = handle.read(8)
        if size < 8:
            raise bad_input(f"{file}: truncated: {size} bytes, shorter than a safetensors header", FIX_DOWNLOAD)
        (length,) = struct.unpack("<Q", head)
        if length > MAX_HEADER:
            raise bad_input(f"{file}: not a safetensors file (its first 8 bytes declare a {length:,}-byte header)",
                            FIX_DOWNLOAD)
        if 8 + length > size:
            raise bad_input(f"{file}: truncated: its header declares {length:,} bytes, the file ends {size - 8:,} "
                            "bytes in", FIX_DOWNLOAD)
        raw = handle.read(length)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise bad_input(f"{file}: not a safetensors file (its header is not JSON)", FIX_DOWNLOAD) from None
    if not isinstance(header, dict):
        raise bad_input(f"{file}: not a safetensors file (its header is not an object)", FIX_DOWNLOAD)
    ends = [entry["data_offsets"][1] for name, entry in header.items() if name != "__metadata__"
            and isinstance(entry, dict) and isinstance(entry.get("data_offsets"), list) and entry["data_offsets"]]
    declared = 8 + length + max(ends, default=0)
    if size < declared:
        raise bad_input(f"{file}: truncated: its header declares {declared:,} bytes, the file has {size:,}",
                        FIX_DOWNLOAD)
    if size > declared:
        raise bad_input(f"{file}: damaged: {size - declared:,} bytes after its tensors, which safetensors refuses",
                        FIX_DOWNLOAD)
    return header


PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")


def check_model_folder(config: RunConfig) -> Path:
    """Refuse a model folder that cannot be loaded safely, before torch touches it."""
    path = config.resolved_model_path()
    field = "model.path"
    missing = not_downloaded(config.model.path)
    if missing:
        raise bad_input(missing)
    if not path.exists():
        raise bad_input(f"{field}: {path} does not exist", "pick a Hugging Face model folder or bundled:tiny")
    if not path.is_dir():
        raise bad_input(f"{field}: {path} is a file; pick the folder that holds config.json")
    config_file = path / "config.json"
    if not config_file.is_file():
        raise bad_input(f"{field}: {path} has no config.json; it is not a Hugging Face model folder")
    model_config = read_config(config_file)  # an object, or one line saying why not
    if model_config.get("auto_map") and not config.model.trust_remote_code:
        raise bad_input(
            f"{field}: {path} needs code shipped with the model (auto_map in config.json)",
            "tick model.trust_remote_code only if you trust its author",
        )
    files = [p.name for p in path.iterdir()]
    has_safetensors = any(n.endswith(".safetensors") for n in files)
    has_pickle = any(n.endswith(PICKLE_SUFFIXES) and "training_args" not in n for n in files)
    if not has_safetensors:
        if has_pickle and not config.model.allow_pickle:
            raise bad_input(
                f"{field}: {path} has only pickle weights (.bin), which can run arbitrary code",
                "convert it to safetensors, or tick model.allow_pickle for this model",
            )
        if not has_pickle:
            raise bad_input(f"{field}: {path} has no weights (*.safetensors)")
    if not any(n in files for n in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json")):
        raise bad_input(f"{field}: {path} has no tokenizer files", "copy the tokenizer into the model folder")
    # The files' contents, still without loading a weight: sizes, headers, shards, vocabulary, remote code.
    check_files(path, model_config, config.model.trust_remote_code, config.model.allow_pickle and has_pickle)
    return path
