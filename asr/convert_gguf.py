"""GGUF causal LM -> transformers directory (safetensors).

transformers dequantizes GGUF at every load (30-90 s here), so the embedded LMs are
converted once. The quantizer transformers attaches refuses `save_pretrained`, so the
dequantized weights are moved into a plain model built from the same config.
"""

from __future__ import annotations

from pathlib import Path

import torch


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory, filename = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=filename)
    quantized = AutoModelForCausalLM.from_pretrained(
        directory, gguf_file=filename, dtype=torch.float32
    )
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(quantized.state_dict(), strict=True)
    # fp16 halves the cache; Q4 weights dequantized keep far fewer significant bits than fp16.
    plain.to(torch.float16).save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
