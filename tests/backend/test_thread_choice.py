"""The worker's CPU thread count is measured on the run's own pass, and measuring changes nothing else."""

from __future__ import annotations

import pytest
import torch

from backend.training.shortcuts.thread_choice import choose_threads


class FakeMachine:
    """A pass whose cost depends on the thread count torch is set to; a clock that only the passes move."""

    def __init__(self, cost: dict[int, float]) -> None:
        self.cost, self.now, self.passes = cost, 0.0, []

    def step(self) -> None:
        threads = torch.get_num_threads()
        self.passes.append(threads)
        self.now += self.cost[threads]

    def clock(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def keep_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_a_small_model_keeps_halving_while_it_gets_faster():
    machine = FakeMachine({8: 0.090, 4: 0.070, 2: 0.055, 1: 0.060})
    choice = choose_threads(machine.step, 8, clock=machine.clock)
    assert choice.threads == 2 and torch.get_num_threads() == 2
    assert choice.seconds == pytest.approx({8: 0.090, 4: 0.070, 2: 0.055, 1: 0.060})
    assert "2 CPU threads" in choice.summary() and "1 thread 60 ms" in choice.summary()


def test_a_large_model_stops_at_the_first_slower_count():
    machine = FakeMachine({8: 0.30, 4: 0.45, 2: 0.8, 1: 1.5})
    choice = choose_threads(machine.step, 8, clock=machine.clock)
    assert choice.threads == 8 and torch.get_num_threads() == 8
    assert set(machine.passes) == {8, 4}  # 2 and 1 never tried: no turning back after a slower count


def test_one_thread_measures_nothing_and_a_slow_pass_stops_measuring():
    machine = FakeMachine({1: 0.05})
    assert choose_threads(machine.step, 1, clock=machine.clock).seconds == {} and machine.passes == []
    slow = FakeMachine({4: 3.0, 2: 1.0, 1: 0.5})
    choice = choose_threads(slow.step, 4, budget_s=2.0, clock=slow.clock)
    assert choice.threads == 4 and slow.passes == [4] and torch.get_num_threads() == 4


def _run(tmp_path, name: str, threads: int, overrides: list[str]) -> tuple[list[float], list[str]]:
    from tests.backend.test_techniques import run_job

    torch.set_num_threads(threads)
    events = run_job(tmp_path, ["technique.lora_dropout=0.1", *overrides], name)
    return ([e.loss for e in events if e.type == "MetricsLogged"],
            [e.detail for e in events if e.type == "PhaseChanged" and e.phase == "threads"])


def test_measuring_leaves_the_training_exactly_as_a_run_pinned_to_the_chosen_count(tmp_path):
    # Dropout on, so that a pass which moved the random state would change every later loss.
    measured, said = _run(tmp_path, "auto", 2, [])
    assert len(said) == 2 and "measured" in said[1] and "2 threads" in said[1] and "1 thread " in said[1]
    chosen = torch.get_num_threads()
    assert said[1].startswith(f"{chosen} CPU thread")
    pinned, none_said = _run(tmp_path, "pinned", chosen, [f"train.cpu_threads={chosen}"])
    assert none_said == []  # the person's own count is never second-guessed
    assert measured == pinned, (said, chosen)
