"""The export formats' doors: per family, the code that refuses, writes and reads back a format, named by
each entry of backend/core/registries/export_formats.py and imported on first use."""
