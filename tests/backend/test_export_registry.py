"""The export format registry: every format has an entry whose facts hang together, and whose doors import
with the functions the export job calls, so a new format that forgets one fails here, not mid-export."""

from __future__ import annotations

import importlib
import inspect

import pytest

from backend.core.registries.export_formats import (ALTERNATIVES, CALIBRATED, DTYPES, EXPORT_FORMATS, FORMATS,
                                                    GGUF_TYPES, TOLERANCES, tolerance)
from backend.core.registries.serving_options import ENGINES, SERVED_FORMATS

NAMES = list(EXPORT_FORMATS)


def test_the_views_are_the_registry():
    assert list(FORMATS) == NAMES == ["adapter", "merged", "bnb-8bit", "bnb-4bit", "gguf-f16", "gguf-q8_0",
                                      "gguf-q5_0", "gguf-q4_0", "gptq-int4", "awq-int4", "w8a8"]
    assert all(name == fmt.name and FORMATS[name] == fmt.description for name, fmt in EXPORT_FORMATS.items())
    assert CALIBRATED == ("gptq-int4", "awq-int4", "w8a8")
    assert GGUF_TYPES == {"gguf-f16": "F16", "gguf-q8_0": "Q8_0", "gguf-q5_0": "Q5_0", "gguf-q4_0": "Q4_0"}
    assert {key.split(":")[0] for key in TOLERANCES} == set(NAMES) and set(ALTERNATIVES) == set(TOLERANCES)


@pytest.mark.parametrize("name", NAMES)
def test_every_format_has_a_tolerance_for_every_dtype(name):
    fmt = EXPORT_FORMATS[name]
    assert set(fmt.bounds) <= {None, *DTYPES} and (None in fmt.bounds or set(DTYPES) <= set(fmt.bounds))
    for dtype in DTYPES:
        max_increase, min_top1 = tolerance(name, dtype)
        assert 0 < max_increase < 1 and 0 < min_top1 <= 1


@pytest.mark.parametrize("name", NAMES)
def test_alternatives_name_other_formats_only(name):
    for dtype, bounds in EXPORT_FORMATS[name].bounds.items():
        assert bounds.alternatives and bounds.why
        for other, other_dtype in bounds.alternatives:
            assert other in EXPORT_FORMATS and other_dtype in (None, *DTYPES)
            assert other != name or (dtype is not None and other_dtype not in (None, dtype)), (name, dtype, other)


def test_served_by_agrees_with_served_formats():
    served = [fmt for fmt in EXPORT_FORMATS.values() if fmt.served_by]
    assert all(fmt.serve_order is not None for fmt in served)
    assert all(fmt.serve_order is None for fmt in EXPORT_FORMATS.values() if not fmt.served_by)
    assert SERVED_FORMATS == tuple(f.name for f in sorted(served, key=lambda f: f.serve_order))
    assert len({f.serve_order for f in served}) == len(served)
    assert all(set(fmt.served_by) <= set(ENGINES) - {"auto"} for fmt in served)
    assert "adapter" not in SERVED_FORMATS  # an adapter is served on its base


def test_family_facts_are_where_their_family_needs_them():
    from backend.serving.weights import BY_FAMILY

    for fmt in EXPORT_FORMATS.values():
        assert (fmt.ggml_type is not None) == (fmt.ggml_bytes is not None) == (fmt.family == "gguf")
        assert (fmt.bits is not None) == (fmt.family in ("bnb", "calibrated"))
        assert (fmt.algorithm is not None) == fmt.calibrated and fmt.merged == (fmt.family != "adapter")
        assert fmt.disk is not None or fmt.family in ("adapter", "gguf")  # those writers plan their bytes
        assert not fmt.served_by or fmt.family in BY_FAMILY  # the serving estimate sizes every served family


@pytest.mark.parametrize("name", NAMES)
def test_door_modules_import_with_what_the_job_calls(name):
    doors = EXPORT_FORMATS[name].doors
    writer, verifier = importlib.import_module(doors.writer), importlib.import_module(doors.verifier)
    assert inspect.isclass(writer.Writer) and callable(writer.Writer.write)
    assert callable(verifier.read_back) and callable(verifier.checks)
    if doors.refusal is not None:
        assert callable(importlib.import_module(doors.refusal).refuse)


@pytest.mark.parametrize("name", list(GGUF_TYPES))
def test_gguf_entries_state_their_ggml_types_bytes(name):
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[GGUF_TYPES[name]]]
    assert EXPORT_FORMATS[name].ggml_bytes == size / block
    assert gguf.LlamaFileType[f"MOSTLY_{GGUF_TYPES[name]}"]  # the file type the writer names


def test_each_calibrated_algorithm_has_its_units():
    from backend.export.calibrated.writer import ALGORITHMS

    assert {EXPORT_FORMATS[name].algorithm for name in CALIBRATED} <= set(ALGORITHMS)
