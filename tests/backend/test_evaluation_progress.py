"""The evaluation's measures count what they measured, before the first batch and after each (issue 33)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from backend.evaluation.perplexity import perplexity


class TinyModel(torch.nn.Module):
    """Logits from an embedding: enough for the measures' loops."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(16, 16)

    def forward(self, input_ids, attention_mask=None):
        return SimpleNamespace(logits=self.embed(input_ids))


def test_perplexity_counts_examples_from_zero():
    rows = [{"input_ids": [1, 2, 3, 4], "labels": [-100, 2, 3, 4]} for _ in range(5)]
    calls = []
    perplexity(TinyModel(), rows, 0, 2, lambda done, total: calls.append((done, total)))
    assert calls == [(0, 5), (2, 5), (4, 5), (5, 5)]



def test_the_cli_prints_a_measure_once_its_count_is_complete():
    import io

    from backend.cli.eval import _eval_progress

    out = io.StringIO()
    for detail in ("base 0/5 examples", "base 2/5 examples", "base 5/5 examples"):
        _eval_progress({"type": "PhaseChanged", "phase": "perplexity", "detail": detail}, out)
    assert out.getvalue() == "[perplexity] base 5/5 examples\n"
