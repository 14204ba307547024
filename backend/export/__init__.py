"""Exports of a finished run: adapter, merged 16-bit, bitsandbytes 4/8-bit, GGUF and calibrated, each verified.

The formats themselves are the torch-free registry backend/core/registries/export_formats.py; each names
the door modules here (doors/) that refuse, write and read it back, which the export job imports inside
the worker.
"""
