"""GRPO's reward functions (backend/training/objectives/rewards.py): the built-in ones score as documented, and a
person's reward file that fails is refused in one line naming the file, the line and the function."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backend.core.config.run_config import RunConfig
from backend.core.config.errors import ConfigError
from backend.core.errors import JobError
from backend.core.config.objectives import RewardSpec
from backend.training.objectives.rewards import final_answer, reward_functions


def score(spec: dict, completions: list, **columns) -> list[float]:
    (fn,) = reward_functions([RewardSpec(**spec)], Path.cwd())
    return fn(prompts=["p"] * len(completions), completions=completions, **columns)


def test_final_answer_reads_the_marks_people_use():
    assert final_answer("Let me think.\nThe answer is below.\nYes.") == "yes"
    assert final_answer("2 + 2 = 4 #### 4") == "4"
    assert final_answer(r"so \boxed{42} it is") == "42"
    assert final_answer("") == ""


def test_exact_match_compares_the_final_answer_with_the_column():
    got = score({"kind": "exact_match"}, ["yes", "No.", "maybe", [{"role": "assistant", "content": "no"}]],
                answer=["yes", "no", "no", "no"])
    assert got == [1.0, 1.0, 0.0, 1.0]


def test_exact_match_names_a_missing_column():
    with pytest.raises(JobError, match="exact_match reads the data column 'solution'"):
        score({"kind": "exact_match", "column": "solution"}, ["yes"], answer=["yes"])


def test_regex_length_json_and_banned():
    assert score({"kind": "regex", "pattern": r"^(yes|no)$"}, ["yes", "yes!", "no"]) == [1.0, 0.0, 1.0]
    assert score({"kind": "length", "target": 10}, ["x" * 10, "x" * 5, "x" * 30, ""]) == [1.0, 0.5, 0.0, 0.0]
    assert score({"kind": "valid_json"}, ['{"a": 1}', " [1, 2] ", "{a: 1}"]) == [1.0, 1.0, 0.0]
    assert score({"kind": "banned", "strings": ["sorry", "As an AI"]}, ["fine", "sorry", "sorry, As an AI"]) == \
        [1.0, 0.5, 0.0]


def test_two_rewards_of_one_kind_get_distinct_names():
    names = [fn.__name__ for fn in reward_functions(
        [RewardSpec(kind="regex", pattern="a"), RewardSpec(kind="regex", pattern="b")], Path.cwd())]
    assert names == ["regex_1", "regex_2"]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "my_rewards.py"
    path.write_text(text)
    return path


def test_a_users_reward_file_runs_with_the_data_columns(tmp_path):
    path = write(tmp_path, "def short(prompts, completions, answer, **kwargs):\n"
                           "    return [float(len(c) < 5 and a == 'x') for c, a in zip(completions, answer)]\n")
    assert score({"kind": "python", "file": str(path), "function": "short"}, ["ab", "abcdef"], answer=["x", "x"]) == \
        [1.0, 0.0]


@pytest.mark.parametrize("source, expected", [
    ("def f(prompts, completions, **kw):\n    return [1.0] * (\n", r"my_rewards.py:2: the reward file does not parse"),
    ("import json\nraise RuntimeError('no key')\n", r"my_rewards.py:2: importing the reward file failed: RuntimeError: no key"),
    ("def other(prompts, completions, **kw):\n    return []\n", r"has no function 'f' \(its functions: other\)"),
    ("def f(prompts, completions, **kw):\n    return 1.0\n", r"my_rewards.py:1: f returned float, not a list of 2 numbers"),
    ("def f(prompts, completions, **kw):\n    return [1.0]\n", r"my_rewards.py:1: f returned 1 scores for 2 completions"),
    ("def f(prompts, completions, **kw):\n    return ['good', 1.0]\n", r"returned 'good' among its scores"),
    ("\n\ndef f(prompts, completions, **kw):\n    return [1 / 0, 1]\n", r"my_rewards.py:3: f raised ZeroDivisionError.*at line 4"),
])
def test_a_failing_reward_file_is_one_line_with_file_line_and_function(tmp_path, source, expected):
    path = write(tmp_path, source)
    with pytest.raises(JobError) as caught:
        score({"kind": "python", "file": str(path), "function": "f"}, ["a", "b"])
    message = caught.value.message
    assert "\n" not in message and str(tmp_path) in message
    assert __import__("re").search(expected, message), message


def test_a_missing_reward_file_is_named(tmp_path):
    with pytest.raises(JobError, match="the reward file .*nothing.py does not exist"):
        score({"kind": "python", "file": str(tmp_path / "nothing.py"), "function": "f"}, ["a"])


@pytest.mark.parametrize("reward, expected", [
    ({"kind": "regex"}, "grpo.rewards.0: a regex reward needs pattern"),
    ({"kind": "regex", "pattern": "("}, "grpo.rewards.0: the regex reward's pattern '(' does not compile"),
    ({"kind": "length"}, "grpo.rewards.0: a length reward needs target"),
    ({"kind": "banned"}, "grpo.rewards.0: a banned reward needs strings"),
    ({"kind": "python", "file": "r.py"}, "grpo.rewards.0: a python reward needs file"),
    ({"kind": "exactmatch"}, "grpo.rewards.0.kind"),
])
def test_a_bad_reward_in_the_config_is_refused_naming_it(reward, expected):
    with pytest.raises(ConfigError) as caught:
        RunConfig.from_dict({"technique": {"objective": "grpo"}, "grpo": {"rewards": [reward]}})
    assert expected in str(caught.value) and "\n" not in str(caught.value)


def test_grpo_config_refusals():
    with pytest.raises(ConfigError, match="grpo.rewards is empty"):
        RunConfig.from_dict({"technique": {"objective": "grpo"}, "grpo": {"rewards": []}})
    with pytest.raises(ConfigError, match="grpo.num_generations 3 must divide the batch of completions"):
        RunConfig.from_dict({"technique": {"objective": "grpo"}, "grpo": {"num_generations": 3}})
    with pytest.raises(ConfigError, match="data.format alpaca is a supervised format; technique.objective grpo"):
        RunConfig.from_dict({"technique": {"objective": "grpo"}, "data": {"format": "alpaca"}})
    json.dumps(RunConfig().model_dump(mode="json"))  # the default config (SFT) still serializes
