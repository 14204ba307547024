"""GGUF exports of a vision-language run (backend/export/gguf_mmproj.py, mmproj_layouts.py, gguf_mmproj_check.py):
the language model's GGUF plus llama.cpp's mmproj file, checked by reading both back into the image-text model
and measuring it on the run's image rows; every mmproj tensor compared with the trained model's. Tiny random
VLMs (tests/vision_models.py) trained 2 steps through the CLI on generated images."""

from __future__ import annotations

import json

import pytest

from tests.backend.test_vision_export import train


@pytest.mark.slow  # 25 to 75 s each on two cores: train 2 steps, export, read both files back, measure
@pytest.mark.parametrize("family,arch,projector", [("qwen2_5_vl", "qwen2vl", "qwen2.5vl_merger"),
                                                  ("qwen3_vl", "qwen3vl", "qwen3vl_merger"), ("gemma3", "gemma3", "gemma3"),
                                                  ("idefics3", "llama", "idefics3")])
def test_a_vlm_run_exports_a_gguf_pair_that_passes_on_its_images(family, arch, projector, tmp_path, capsys):
    import gguf

    from backend.cli.app import main

    run = train(tmp_path, family, projector="full")
    assert main(["export", str(run), "--format", "gguf-f16"]) == 0
    out = run / "exports" / "gguf-f16"
    assert "PASSED: gguf-f16 export" in capsys.readouterr().out
    text, mmproj = gguf.GGUFReader(out / "model.gguf"), gguf.GGUFReader(out / "mmproj.gguf")
    assert text.fields["general.architecture"].contents() == arch
    assert mmproj.fields["general.architecture"].contents() == "clip"
    assert mmproj.fields["clip.projector_type"].contents() == projector
    report = json.loads((out / "export_report.json").read_text())
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["mmproj tensors"]["outcome"] == "passed"
    assert "rows with their images" in checks["perplexity"]["what"]
    modelfile = (out / "Modelfile").read_text()
    assert "FROM ./model.gguf\nFROM ./mmproj.gguf" in modelfile


def _tiny(family: str, tmp_path):
    """A tiny random VLM of the family and a TensorSource over its weights as saved."""
    import torch

    from tests import vision_models

    from backend.export.checkpoint_files import CheckpointFiles, read_config
    from backend.export.model_layout import ModelLayout
    from backend.export.merged_source import MergedSource

    folder = vision_models.build_tiny_vlm(family, tmp_path / family)
    files = CheckpointFiles(folder)
    source = MergedSource(files, ModelLayout.build(folder, files.shapes()), None, torch.float32)
    return folder, read_config(folder), source


@pytest.mark.parametrize("family,projector,tensors", [("qwen2_5_vl", "qwen2.5vl_merger", 39), ("qwen3_vl", "qwen3vl_merger", 40),
                                                      ("gemma3", "gemma3", 39), ("idefics3", "idefics3", 38)])
def test_the_mmproj_file_holds_every_tower_and_projector_tensor_in_llama_cpps_layout(family, projector, tensors, tmp_path):
    import gguf

    from backend.export.gguf_mmproj import MmprojExport, processor_settings
    from backend.export.gguf_mmproj_check import mmproj_check

    folder, config, source = _tiny(family, tmp_path)
    export = MmprojExport(source, config, processor_settings((folder,)), "tiny")
    export.write(tmp_path / "mmproj.gguf")
    reader = gguf.GGUFReader(tmp_path / "mmproj.gguf")
    assert reader.fields["clip.projector_type"].contents() == projector
    assert reader.fields["clip.vision.projection_dim"].contents() == (config.get("text_config") or config)["hidden_size"]
    assert len(reader.tensors) == tensors
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert all(types[n] == "F32" for n in types if n.endswith(("bias", "ln1.weight", "ln2.weight", "position_embd.weight")))
    assert any(kind == "F16" for kind in types.values())
    check = mmproj_check(tmp_path / "mmproj.gguf", export.layout, source, config["vision_config"])
    assert check["outcome"] == "passed", check["measured"]


@pytest.mark.parametrize("swap", [("v.blk.0.attn_q.weight", "v.blk.0.attn_k.weight"),
                                  ("v.blk.0.ffn_up.weight", "v.blk.0.ffn_gate.weight")])
def test_a_tensor_written_under_another_name_fails_the_mmproj_check(swap, tmp_path):
    from backend.export.gguf_mmproj import MmprojExport, processor_settings
    from backend.export.gguf_mmproj_check import mmproj_check

    folder, config, source = _tiny("qwen2_5_vl", tmp_path)
    export = MmprojExport(source, config, processor_settings((folder,)), "tiny")
    first, second = (next(t for t in export.plan if t.gguf_name == name) for name in swap)
    first.gguf_name, second.gguf_name = second.gguf_name, first.gguf_name
    export.write(tmp_path / "mmproj.gguf")
    check = mmproj_check(tmp_path / "mmproj.gguf", export.layout, source, config["vision_config"])
    assert check["outcome"] == "failed"
    assert "visual.blocks.0." in check["measured"]


def test_a_qwen2_5_vl_language_model_is_written_as_qwen2vl_with_its_rope_sections(tmp_path):
    import gguf
    from transformers import AutoTokenizer

    from backend.export.gguf_writer import GgufExport

    folder, config, source = _tiny("qwen2_5_vl", tmp_path)
    export = GgufExport(source, AutoTokenizer.from_pretrained(folder), "gguf-q8_0", "tiny")
    export.write(tmp_path / "model.gguf")
    reader = gguf.GGUFReader(tmp_path / "model.gguf")
    assert reader.fields["general.architecture"].contents() == "qwen2vl"
    assert reader.fields["qwen2vl.rope.dimension_sections"].contents() == [16, 24, 24, 0]
    assert not any(t.name.startswith(("v.", "mm.")) for t in reader.tensors)  # the tower is the mmproj's


@pytest.mark.parametrize("family,allowed", [("Qwen2.5-VL", True), ("Qwen3-VL", True), ("Gemma 3 (4B and up)", True),
                                            ("SmolVLM / Idefics3", True), ("LLaVA-1.5", False),
                                            ("Qwen3.5 (with its vision tower)", False)])
def test_gguf_formats_refuse_only_the_families_without_an_mmproj_layout(family, allowed):
    from backend.core.registries.export_formats import vision_formats, vision_refusal

    refusal = vision_refusal("gguf-q4_0", family)
    assert (refusal is None) == allowed
    assert ("gguf-f16" in vision_formats(family)) == allowed
    if refusal:
        assert refusal[0].startswith(f"gguf-q4_0 of a {family} run is not built yet (the mmproj half")
        assert "Qwen2.5-VL, Qwen3-VL, Gemma 3 (4B and up), SmolVLM / Idefics3 only" in refusal[0]
        assert "gguf" not in refusal[1]


def test_a_qwen3_vl_language_model_is_written_as_qwen3vl_with_its_deepstack_count(tmp_path):
    import gguf
    from transformers import AutoTokenizer

    from backend.export.gguf_writer import GgufExport

    folder, config, source = _tiny("qwen3_vl", tmp_path)
    GgufExport(source, AutoTokenizer.from_pretrained(folder), "gguf-f16", "tiny").write(tmp_path / "model.gguf")
    reader = gguf.GGUFReader(tmp_path / "model.gguf")
    assert reader.fields["general.architecture"].contents() == "qwen3vl"
    assert reader.fields["qwen3vl.n_deepstack_layers"].contents() == len(config["vision_config"]["deepstack_visual_indexes"])
    assert reader.fields["qwen3vl.rope.dimension_sections"].contents() == [24, 20, 20, 0]
    assert {"blk.0.attn_q_norm.weight", "blk.0.attn_k_norm.weight"} <= {t.name for t in reader.tensors}
