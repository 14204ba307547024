"""The base weights a qlora/lora8 run trained against, rebuilt one tensor at a time.

A QLoRA adapter learned against the NF4 codes of its base, not the original weights, so the merge
starts from those: the original weight is cast to the dtype the run loaded it in, quantized by the
very call transformers' bitsandbytes integration makes (`Params4bit(...).to(device)`, i.e.
`quantize_4bit` with blocksize 64, double quantization, uint8 storage; `Int8Params`, i.e.
`int8_vectorwise_quant` of the fp16 weight, for LLM.int8), and dequantized again with
`dequantize_4bit` / `int8_vectorwise_dequant`, the functions peft itself merges with. Only that one
weight is in memory, in three forms, for the length of the call.
"""

from __future__ import annotations

from typing import Any

import torch


def bnb_config(quantization: str, compute_dtype: torch.dtype, skip: list[str] | None = None) -> Any:
    """The BitsAndBytesConfig backend.training.model.loading.load_model uses (the compute dtype does not change
    codes); skip: the modules a vision-language run kept in 16-bit (backend/training/vision/parts.py)."""
    from transformers import BitsAndBytesConfig

    if quantization == "nf4":
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                  bnb_4bit_compute_dtype=compute_dtype, llm_int8_skip_modules=skip)
    return BitsAndBytesConfig(load_in_8bit=True, llm_int8_skip_modules=skip)


def dequantized(weight: torch.Tensor, quantization: str, load_dtype: torch.dtype, device: str,
                attrs: dict[str, Any]) -> torch.Tensor:
    """`weight` (Linear orientation) -> the values the run's quantized layer held: NF4 dequantizes into the
    load dtype (the quantization state's), LLM.int8 into fp32 (`CB * SCB / 127`), as peft merges them."""
    import bitsandbytes as bnb
    import bitsandbytes.functional as F

    value = weight.to(device=device, dtype=load_dtype)
    if quantization == "nf4":
        param = bnb.nn.Params4bit(value, requires_grad=False, **attrs).to(device)
        # No forward pass runs here, so bitsandbytes' CPU repacking has not touched the codes.
        out = F.dequantize_4bit(param.data, param.quant_state)
    else:
        param = bnb.nn.Int8Params(value.to("cpu"), requires_grad=False, **attrs).to(device)
        out = F.int8_vectorwise_dequant(param.data, param.SCB)
    del param, value
    return out.cpu()
