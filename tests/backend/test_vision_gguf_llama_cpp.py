"""llama.cpp itself answers on an image from a VLM run's GGUF pair (model.gguf + mmproj.gguf) as transformers does.

Opt-in (slow) and only where llama-cpp-python with mtmd is importable: build it from source into its own venv
(CMAKE_ARGS="-DGGML_NATIVE=OFF ... -DLLAVA_BUILD=ON" pip install --no-binary llama-cpp-python llama-cpp-python)
and point LLAMA_SITE at its site-packages, as bench/llama_cpp_check.py's --llama-site does. The image's sides
are multiples of the tower's patch x merge, so neither side resizes it and both see the same pixels.
"""

from __future__ import annotations

import ctypes
import io
import os
import sys

import pytest

from tests import vision_models
from tests.backend.test_vision_export import train

if os.environ.get("LLAMA_SITE"):
    sys.path.append(os.environ["LLAMA_SITE"])

pytestmark = pytest.mark.slow

QUESTION = "What is in this picture?"
CASES = {  # family: an image's width and height that neither llama.cpp nor transformers resizes
    "qwen2_5_vl": (112, 84),  # 4 x 3 merged 28-pixel patches
    "qwen3_vl": (128, 96),  # 4 x 3 merged 32-pixel patches
    "gemma3": (896, 896),  # the tower's square
    "idefics3": (1024, 512),  # two 512-pixel tiles at the processor's longest edge (1024) and the shrunk whole
}
"""SmolVLM: llama.cpp's mtmd always cuts an idefics3 image into tiles plus the shrunk whole, where transformers
keeps an image of at most one tile whole (a 512 x 512 image at longest edge 512: 128 image tokens against 64), so
the image is two tiles wide at the processor's longest edge: neither side resizes it, both crop the same tiles, and
both shrink the whole to one tile with Pillow's Lanczos filter (clip.cpp ports Pillow's resampling)."""
AROUND = {"gemma3": ("\n\n", "\n\n")}
"""Text transformers' processor puts around an image and llama.cpp's mtmd does not (Gemma3Processor's
full_image_sequence), given to llama.cpp in the prompt so both read the same tokens."""


def llama_cpp_answer(text_path, mmproj_path, image, steps: int, around: tuple[str, str] = ("", "")):
    """(prompt token ids of the text chunks, first-step log-probs, greedy answer ids) from llama.cpp's mtmd."""
    import numpy as np
    from llama_cpp import Llama, llama_cpp
    from llama_cpp.llama_chat_format import MTMDChatHandler

    llama = Llama(str(text_path), n_ctx=512, n_batch=512, logits_all=True, verbose=False)
    handler = MTMDChatHandler(clip_model_path=str(mmproj_path), verbose=False, use_gpu=False)
    handler._init_mtmd_context(llama)
    mtmd = handler._mtmd_cpp
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    bitmap = handler._create_bitmap_from_bytes(buffer.getvalue())
    text = (around[0] + mtmd.mtmd_default_marker().decode() + around[1] + QUESTION).encode()
    prompt = mtmd.mtmd_input_text()
    prompt.text, prompt.text_len, prompt.add_special, prompt.parse_special = text, len(text), True, True
    chunks = mtmd.mtmd_input_chunks_init()
    assert mtmd.mtmd_tokenize(handler.mtmd_ctx, chunks, ctypes.byref(prompt),
                              (mtmd.mtmd_bitmap_p_ctypes * 1)(bitmap), 1) == 0
    ids, image_tokens = [], 0
    for i in range(mtmd.mtmd_input_chunks_size(chunks)):
        chunk = mtmd.mtmd_input_chunks_get(chunks, i)
        if mtmd.mtmd_input_chunk_get_type(chunk) == mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT:
            count = ctypes.c_size_t()
            pointer = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(count))
            tokens = [pointer[j] for j in range(count.value)]
            ids += tokens
            llama.eval(tokens)
        else:
            image_tokens += mtmd.mtmd_input_chunk_get_n_tokens(chunk)
            past = llama_cpp.llama_pos(0)
            assert mtmd.mtmd_helper_eval_chunk_single(handler.mtmd_ctx, llama._ctx.ctx, chunk, llama.n_tokens, 0,
                                                      llama.n_batch, False, ctypes.byref(past)) == 0
            llama.n_tokens = past.value
    first = np.asarray(llama.scores[llama.n_tokens - 1], dtype=np.float64)
    answer = []
    for _ in range(steps):
        token = int(np.argmax(llama.scores[llama.n_tokens - 1]))
        answer.append(token)
        llama.eval([token])
    mtmd.mtmd_input_chunks_free(chunks)
    mtmd.mtmd_bitmap_free(bitmap)
    return ids, image_tokens, first - np.logaddexp.reduce(first), answer


def transformers_answers(run, family: str, images: list, steps: int) -> list:
    """Per image: (prompt ids, image tokens, first-step log-probs, greedy answer ids) of the trained model in fp32."""
    import torch

    from backend.core.runs.run_folder import RunFolder
    from backend.export.merge import TrainedRun, load_trained
    from backend.training.model.vision_processor import load_vision_processor

    trained = TrainedRun.check(run, RunFolder(run).load_config(), "merged")
    model = load_trained(trained, torch.float32, "cpu")
    processor = load_vision_processor(trained.base_path)
    image_id = vision_models.image_token_id(family, model.config)
    out = []
    for image in images:
        inputs = processor(text=[vision_models.PROMPT_IMAGE[family] + QUESTION], images=[[image]], return_tensors="pt")
        ids = inputs["input_ids"][0].tolist()
        with torch.no_grad():
            logits = model(**inputs).logits[0, -1].double()
            answer = model.generate(**inputs, max_new_tokens=steps, do_sample=False)[0, len(ids):].tolist()
        out.append(([i for i in ids if i != image_id], ids.count(image_id), torch.log_softmax(logits, -1).numpy(),
                    answer))
    return out


@pytest.mark.parametrize("family", list(CASES))
def test_llama_cpp_answers_on_the_image_as_transformers_does(family, tmp_path, capsys):
    pytest.importorskip("llama_cpp.mtmd_cpp", reason="llama-cpp-python with mtmd is not importable (set LLAMA_SITE)")
    import numpy as np

    from backend.cli.app import main

    run = train(tmp_path, family, projector="full")
    assert main(["export", str(run), "--format", "gguf-f16"]) == 0
    out = run / "exports" / "gguf-f16"
    image, other = (vision_models.image(*CASES[family], seed=seed) for seed in (3, 4))
    got_ids, got_images, got, got_answer = llama_cpp_answer(out / "model.gguf", out / "mmproj.gguf", image, 4,
                                                            AROUND.get(family, ("", "")))
    (want_ids, want_images, want, want_answer), (_, _, elsewhere, _) = transformers_answers(run, family,
                                                                                           [image, other], 4)
    top = np.argsort(want)[::-1][:10]
    diff = float(np.max(np.abs(got[top] - want[top])))
    image_effect = float(np.max(np.abs(elsewhere[top] - want[top])))  # what another image moves: the check sees it
    print(f"{family}: image tokens llama.cpp {got_images} / transformers {want_images}; prompt ids equal "
          f"{got_ids == want_ids}; largest |log-prob diff| over transformers' top 10 {diff:.4f} (another image "
          f"moves them {image_effect:.4f}); answers {got_answer} / {want_answer}", file=sys.stderr)
    assert diff < image_effect / 10
    assert got_images == want_images
    assert got_ids[-len(want_ids):] == want_ids or got_ids == want_ids
    assert int(np.argmax(got)) == int(np.argmax(want))
    assert diff < 0.05  # gguf-f16's weights against the fp32 model: the text bound's order (docs/export.md)
    assert got_answer[0] == want_answer[0]
