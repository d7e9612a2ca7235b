"""What a run's figures depend on beyond its config: the CPU, as /proc/cpuinfo names it, and the vector instructions
torch's kernels use on it. These VMs call several EPYC generations "AMD EPYC"; family and model tell them apart
(family 25 model 17: Zen 4, with AVX-512), and on the same config and seed, kernels of another instruction set
round differently and a run's trajectory moves as under another seed (docs/baselines.md, "Figures and hosts")."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def cpu_identity() -> dict:
    """{"cpu": model name, "family", "model", "stepping", "capability": torch's vector ISA (AVX512, AVX2, ...),
    "cores"}; fields /proc/cpuinfo lacks are None."""
    import torch

    fields = {"model name": None, "cpu family": None, "model": None, "stepping": None}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            name, _, value = line.partition(":")
            if name.strip() in fields and fields[name.strip()] is None:
                fields[name.strip()] = value.strip()
            if line.strip() == "":
                break  # the first processor's block
    except OSError:
        pass
    return {
        "cpu": fields["model name"] or platform.processor() or platform.machine(),
        "family": fields["cpu family"],
        "model": fields["model"],
        "stepping": fields["stepping"],
        "capability": torch.backends.cpu.get_cpu_capability(),
        "cores": os.cpu_count(),
    }


def describe(identity: dict) -> str:
    """One line: 'AMD EPYC (family 25 model 17), AVX512'."""
    where = f" (family {identity['family']} model {identity['model']})" if identity.get("family") else ""
    return f"{identity['cpu']}{where}, {identity['capability']}"
