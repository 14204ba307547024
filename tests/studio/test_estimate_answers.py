"""The Techniques page answers the estimate's inverse questions: the longest seq_len that fits this
machine (beside the sequence length field) and which CUDA card sizes the run fits; the CUDA parts and
the activations carry their why in a hover."""

from __future__ import annotations

from backend.core.config.run_config import RunConfig
from backend.estimate import estimate
from backend.estimate.seq_len import with_seq_len
from studio.widgets.memory_breakdown_widget import CUDA_NOTES, activations_note
from tests.backend.test_estimate_families import GPT2_XL
from tests.fakes.fake_nvml import FakeSampler


def test_longest_seq_len_and_cards_on_the_techniques_page(qtbot, make_studio):
    studio = make_studio(sampler=FakeSampler(nvml=False))
    estimate_state, page = studio.estimate, studio.pages["techniques"]
    qtbot.waitUntil(lambda: estimate_state.seq_len_answer is not None and bool(estimate_state.cards), timeout=10000)
    answer = estimate_state.seq_len_answer
    assert answer.limit_bytes == estimate_state.limit_bytes
    assert page.max_seq_len_label.text() in (f"Longest that fits RAM: {answer.seq_len:,}",  # says which memory
                                             f"Longest that fits RAM: {answer.seq_len:,} (model's limit)")
    assert "this machine's RAM" in page.max_seq_len_label.toolTip()
    assert page.breakdown.cards_label.text().startswith("On CUDA: fits ")
    studio.config.set("train.seq_len", 64)  # the answers follow the draft
    qtbot.waitUntil(lambda: estimate_state.seq_len_answer is not answer, timeout=10000)



def test_cuda_parts_and_activations_say_why():
    assert "H200" in CUDA_NOTES["cuda_context"] and "768 MiB" in CUDA_NOTES["cuda_context"]
    assert "calibrated on two H200 runs" in CUDA_NOTES["allocator_reserve"]
    run = RunConfig.from_dict({"technique": {"method": "full", "precision": "bf16", "attention": "sdpa",
                                             "gradient_checkpointing": False},
                               "train": {"seq_len": 1024, "micro_batch_size": 32}})
    note = activations_note(estimate(GPT2_XL, run, device="cpu").details)
    assert "seed article" in note and "s x s attention probabilities" in note and "dropout masks" in note
    assert "gelu_new" in note and note.count("\n") == 0
    cuda = activations_note(estimate(GPT2_XL, with_seq_len(run, 1024), device="cuda").details)
    assert "probabilities" not in cuda
