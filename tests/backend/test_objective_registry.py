"""The objective registry (backend/training/objectives/registry.py): every technique.objective, SFT
included, has one registered method whose door holds the reader and the trainer builder."""

import typing

import pytest

from backend.core.config.objectives import Objective
from backend.training.objectives.registry import OBJECTIVES, ObjectiveMethod, objective_method, register_objective


def test_every_objective_of_the_config_is_registered_once():
    assert set(OBJECTIVES) == set(typing.get_args(Objective))
    assert [name for name, method in OBJECTIVES.items() if not method.through_trl] == ["sft"]


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_each_door_reads_its_data_and_builds_its_trainer(name):
    door = objective_method(name).door()
    assert callable(door.build_datasets) and callable(door.make_trainer)


def test_a_name_registered_twice_is_refused():
    with pytest.raises(ValueError, match="registered twice"):
        register_objective(ObjectiveMethod("sft", "backend.training.objectives.sft", "x", False))
