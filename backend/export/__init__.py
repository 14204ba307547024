"""Exports of a finished run: adapter, merged 16-bit, bitsandbytes 4/8-bit and GGUF, each verified.

Only `formats` is torch-free (the CLI and the studio read the format list from it); the other
modules are imported by the export job inside the worker.
"""
