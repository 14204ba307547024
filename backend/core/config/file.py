"""Reading a config file into a dict: the bytes, the text and the YAML, each failure one ConfigError line.

Stricter than yaml.safe_load where its silence would cost the user what they wrote: a key given twice
(YAML keeps the last one without a word) and an empty file (which would train the demo run) are
refused with the line to fix. Torch-free, and free of backend.core.config.run_config (which calls it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from backend.core.config.errors import ConfigError

MAX_CONFIG_BYTES = 1_000_000
"""A config is a few KB of sections and fields: a file past this is not one, and is refused before YAML
spends a long silence parsing it."""
KINDS = {list: "a list", str: "plain text", int: "a number", float: "a number", bool: "a yes/no value"}
"""What a top-level value that is not a mapping is called in the error."""


def read_config_text(path: Path) -> str:
    """The file as text, or one line saying why it cannot be a config (missing, a folder, binary, too big, ...)."""
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_CONFIG_BYTES + 1)  # never more: a huge file is refused unread
            size = max(os.fstat(handle.fileno()).st_size, len(data))  # a pipe's st_size is 0
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except IsADirectoryError:
        inside = path / "config.yaml"
        fix = f"its run's config is {inside}" if inside.is_file() else "give the YAML file inside it"
        raise ConfigError(f"{path}: is a folder, not a config file; {fix}") from None
    except NotADirectoryError:
        raise ConfigError(f"{path}: a part of the path is a file, not a folder; check the path") from None
    except PermissionError:
        raise ConfigError(f"{path}: cannot be read (permission denied); check the file's permissions") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read ({exc.strerror or exc}); check the path") from None
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: {size / 1e6:,.1f} MB, too big to be a config file (a config is a few KB; the "
                          f"limit is {MAX_CONFIG_BYTES / 1e6:.0f} MB); check that this is the YAML config you meant")
    if b"\x00" in data:
        utf16 = data[:2] in (b"\xff\xfe", b"\xfe\xff")
        what = "is UTF-16 text" if utf16 else "looks like a binary file, not a YAML config"
        raise ConfigError(f"{path}: {what}; save the config as UTF-8 YAML")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise ConfigError(f"{path} line {line}: not UTF-8 text; save the config as UTF-8 YAML") from None


def parse_config_yaml(text: str, source: str) -> dict[str, Any]:
    """The YAML mapping of sections; an empty file, a key given twice or bad YAML is one ConfigError line."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            raise ConfigError(f"{source}: the file is empty; write the fields to change (e.g. `train:` and "
                              "under it `  max_steps: 10`) or start from resources/presets/tiny_lora.yaml")
        twice = duplicate_key(node)
        if twice:
            what, dotted, first, line = twice
            raise ConfigError(f"{source} line {line}: {what} {dotted} is given twice (first on line {first}); "
                              "YAML would keep only the last one without a word, so merge them into one")
        raw = loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise ConfigError(yaml_problem(exc, source)) from None
    except RecursionError:  # PyYAML composes nested values recursively
        raise ConfigError(f"{source}: nested too deeply to be a config; a config is sections (model:, "
                          "train:, ...) of fields") from None
    finally:
        loader.dispose()
    if not isinstance(raw, dict):
        kind = KINDS.get(type(raw), type(raw).__name__)
        raise ConfigError(f"{source}: expected a mapping of sections (model:, data:, train:, ...), got {kind}")
    return raw


def yaml_problem(exc: yaml.YAMLError, source: str) -> str:
    """A YAML syntax error as `file line N: not valid YAML (what)`, with the fix for a tab indent."""
    mark = getattr(exc, "problem_mark", None)
    where = f" line {mark.line + 1}" if mark is not None else ""
    problem = str(getattr(exc, "problem", None) or exc)
    fix = "; indent with spaces, not tabs" if "'\\t'" in problem else ""
    return f"{source}{where}: not valid YAML ({problem}){fix}"


def duplicate_key(node: yaml.Node, path: tuple[str, ...] = (), seen_nodes: set[int] | None = None
                  ) -> tuple[str, str, int, int] | None:
    """The first key written twice in one mapping, as (section|key, dotted path, first line, second line)."""
    seen_nodes = set() if seen_nodes is None else seen_nodes
    if id(node) in seen_nodes:  # an alias: already walked (and an alias bomb stays cheap)
        return None
    seen_nodes.add(id(node))
    children: list[tuple[tuple[str, ...], yaml.Node]] = []
    if isinstance(node, yaml.MappingNode):
        lines: dict[str, int] = {}
        for key, value in node.value:
            if not isinstance(key, yaml.ScalarNode) or key.value == "<<":
                continue
            line = key.start_mark.line + 1
            if key.value in lines:
                what = "section" if not path and isinstance(value, yaml.MappingNode) else "key"
                return what, ".".join((*path, key.value)), lines[key.value], line
            lines[key.value] = line
            children.append(((*path, key.value), value))
    elif isinstance(node, yaml.SequenceNode):
        children = [((*path, str(i)), item) for i, item in enumerate(node.value)]
    for child_path, child in children:
        found = duplicate_key(child, child_path, seen_nodes)
        if found:
            return found
    return None
