"""What a CPU benchmark ran on: the same code runs at very different relative speeds on
different CPUs (on one with AMX, oneDNN's bf16 and int8 kernels gain far more than
CTranslate2's), so every saved report names the processor and the instruction sets that
decide it."""

from __future__ import annotations

import os
import platform
from pathlib import Path

# The features that pick the kernels this project and its baselines run.
KERNEL_FEATURES = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")


def describe_cpu(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict:
    """{"cpu": model name, "cpus": logical CPUs, "features": those of KERNEL_FEATURES it has}."""
    model, flags = platform.processor() or platform.machine(), set()
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break  # every CPU lists the same; the model name comes first
    return {
        "cpu": model,
        "cpus": os.cpu_count(),
        "features": [name for name in KERNEL_FEATURES if name in flags],
    }
