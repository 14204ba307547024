"""GRPO's reward functions: the built-in ones and the person's own Python file, in TRL's reward signature.

Each function takes `prompts`, `completions` (text, or lists of chat messages for conversational
prompts) and the data's other columns as keywords, and returns one float per completion. A user's
file is imported here, in the worker, never in the studio; an import that fails, a missing
function, or a result of the wrong shape is refused in one line naming the file, line and function.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import math
import re
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from backend.core.errors import bad_input
from backend.core.config.objectives import RewardSpec

RewardFn = Callable[..., list[float]]
PUNCTUATION = " \t\r\n.,;:!?\"'`*()[]"


def completion_text(completion: Any) -> str:
    """A completion as text: itself, or the contents of its chat messages."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        return "\n".join(str(m.get("content", "")) if isinstance(m, dict) else str(m) for m in completion)
    if isinstance(completion, dict):
        return str(completion.get("content", ""))
    return str(completion)


def final_answer(text: str) -> str:
    """What a completion answers: after its last '####' (GSM8K's mark), inside its last \\boxed{}, or its
    last non-empty line; lower-cased, surrounding spaces and punctuation dropped."""
    if "####" in text:
        text = text.rsplit("####", 1)[1]
    else:
        boxed = re.findall(r"\\boxed\{([^{}]*)\}", text)
        if boxed:
            text = boxed[-1]
        else:
            lines = [line for line in text.splitlines() if line.strip()]
            text = lines[-1] if lines else ""
    return text.strip(PUNCTUATION).casefold()


def _exact_match(spec: RewardSpec) -> RewardFn:
    def exact_match(prompts: list, completions: list, **columns: Any) -> list[float]:
        answers = columns.get(spec.column)
        if answers is None:
            raise bad_input(f"grpo.rewards: exact_match reads the data column {spec.column!r}, which the data does not have",
                            "name the column with the known answers in the reward's column")
        return [float(final_answer(completion_text(c)) == final_answer(str(a))) for c, a in zip(completions, answers)]
    return exact_match


def _regex(spec: RewardSpec) -> RewardFn:
    pattern = re.compile(spec.pattern)

    def regex(prompts: list, completions: list, **columns: Any) -> list[float]:
        return [float(pattern.search(completion_text(c)) is not None) for c in completions]
    return regex


def _length(spec: RewardSpec) -> RewardFn:
    def length(prompts: list, completions: list, **columns: Any) -> list[float]:
        return [max(0.0, 1.0 - abs(len(completion_text(c)) - spec.target) / spec.target) for c in completions]
    return length


def _valid_json(spec: RewardSpec) -> RewardFn:
    def valid_json(prompts: list, completions: list, **columns: Any) -> list[float]:
        out = []
        for c in completions:
            try:
                json.loads(completion_text(c).strip())
                out.append(1.0)
            except ValueError:
                out.append(0.0)
        return out
    return valid_json


def _banned(spec: RewardSpec) -> RewardFn:
    strings = [s for s in spec.strings if s]

    def banned(prompts: list, completions: list, **columns: Any) -> list[float]:
        return [1.0 - sum(s in completion_text(c) for s in strings) / len(strings) for c in completions]
    return banned


BUILT_IN = {"exact_match": _exact_match, "regex": _regex, "length": _length, "valid_json": _valid_json,
            "banned": _banned}


def _user_function(spec: RewardSpec, base: Path) -> RewardFn:
    path = Path(spec.file).expanduser()
    path = path if path.is_absolute() else base / path
    if not path.is_file():
        raise bad_input(f"grpo.rewards: the reward file {path} does not exist", "give the path of your .py file in file")
    name = f"finetune_studio_reward_{abs(hash(str(path)))}"
    try:
        module_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(module_spec)  # type: ignore[arg-type]
        sys.modules[name] = module
        module_spec.loader.exec_module(module)  # type: ignore[union-attr]
    except SyntaxError as exc:
        raise bad_input(f"{path}:{exc.lineno}: the reward file does not parse: {exc.msg}",
                        "fix the syntax error") from None
    except Exception as exc:
        line = _line_in(path, exc)
        raise bad_input(f"{path}:{line}: importing the reward file failed: {type(exc).__name__}: {exc}",
                        "fix the file so that it imports on its own (python -c 'import ...')") from None
    fn = getattr(module, spec.function, None)
    if not callable(fn):
        found = sorted(n for n, v in vars(module).items() if inspect.isfunction(v) and not n.startswith("_"))
        raise bad_input(f"{path}: has no function {spec.function!r} (its functions: {', '.join(found) or 'none'})",
                        "set the reward's function to one of them")
    line = inspect.getsourcelines(fn)[1] if inspect.isfunction(fn) else 0
    where = f"{path}:{line}: {spec.function}"

    def user_reward(prompts: list, completions: list, **columns: Any) -> list[float]:
        try:
            result = fn(prompts=prompts, completions=completions, **columns)
        except Exception as exc:
            raise bad_input(f"{where} raised {type(exc).__name__}: {exc} (at line {_line_in(path, exc)})",
                            "a reward function takes prompts, completions and **kwargs and returns one float each") from None
        return checked_scores(result, len(completions), where)
    user_reward.__name__ = spec.function
    return user_reward


def _line_in(path: Path, exc: BaseException) -> int | str:
    """The line of `path` where `exc` was raised, or '?'."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename) == path]
    return frames[-1].lineno if frames else "?"


def checked_scores(result: Any, count: int, where: str) -> list[float]:
    """`result` as `count` floats (None, TRL's 'does not apply', stays None); anything else is refused."""
    if not isinstance(result, Sequence) or isinstance(result, (str, bytes)):
        raise bad_input(f"{where} returned {type(result).__name__}, not a list of {count} numbers",
                        "return one float per completion")
    if len(result) != count:
        raise bad_input(f"{where} returned {len(result)} scores for {count} completions", "return one float per completion")
    out = []
    for value in result:
        if value is None:
            out.append(None)
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
            raise bad_input(f"{where} returned {value!r} among its scores, not a finite number",
                            "return one float per completion (None where it does not apply)")
        out.append(float(value))
    return out


def reward_functions(specs: Sequence[RewardSpec], base: Path) -> list[RewardFn]:
    """One callable per spec, named by its label (TRL logs rewards/<name>/mean); user files resolved from `base`."""
    functions = []
    for spec in specs:
        fn = _user_function(spec, base) if spec.kind == "python" else BUILT_IN[spec.kind](spec)
        functions.append(fn)
    names = [fn.__name__ for fn in functions]
    for index, fn in enumerate(functions):  # two regex rewards would log under one name
        if names.count(fn.__name__) > 1:
            fn.__name__ = f"{fn.__name__}_{index + 1}"
    return functions
