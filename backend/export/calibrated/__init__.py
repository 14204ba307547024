"""Calibrated 4-bit and 8-bit exports (GPTQ, AWQ, SmoothQuant) in the compressed-tensors format.

The merged 16-bit model is written first (the merged export's own path), loaded, calibrated on the
run's training data, quantized by the algorithm the format names, and saved by compressed-tensors,
whose config and packing vLLM and transformers read. docs/export.md says why the algorithms are ours
and the file format is the library's.
"""
