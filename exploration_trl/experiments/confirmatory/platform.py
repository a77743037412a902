"""The numeric platform a run segment ran on (amendment 2, configs/confirmatory/countdown3_v2_amendment2.yaml).

A CPU's kernels round differently, and rounding decides an RL trajectory after a few dozen steps, so the second
protocol records, for every run segment, what decides the numbers: the CPU (vendor, family, model, stepping, model
name and the vector ISA flags the kernels dispatch on), the kernel level torch picked, and the library versions.
`platform_id` names that description in 12 hex digits. Host names, core counts and times are left out: they do not
change a number.
"""

from __future__ import annotations

import hashlib
import json
import platform as _stdlib_platform
from typing import Any

#: The /proc/cpuinfo flags torch's and oneDNN's CPU kernels dispatch on.
ISA_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512dq", "avx512bw", "avx512vl", "avx512_vnni",
             "avx512_bf16", "avx512_fp16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8")
#: The libraries whose versions are part of a platform.
LIBRARIES = ("torch", "transformers", "trl", "accelerate", "numpy")
CPU_FIELDS = {"vendor_id": "vendor", "cpu family": "family", "model": "model", "stepping": "stepping",
              "model name": "model_name"}


def cpu(cpuinfo: str | None = None) -> dict[str, Any]:
    """The first processor's fields of `/proc/cpuinfo` (or `cpuinfo`) that decide kernels, and its ISA flags."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            cpuinfo = ""
    out: dict[str, Any] = {}
    flags: set[str] = set()
    for line in cpuinfo.split("\n\n")[0].splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key in CPU_FIELDS:
            out[CPU_FIELDS[key]] = value
        elif key == "flags":
            flags = set(value.split())
    if not out:
        out["model_name"] = _stdlib_platform.processor() or _stdlib_platform.machine()
    out["isa"] = [f for f in ISA_FLAGS if f in flags]
    return out


def versions() -> dict[str, str | None]:
    from importlib import metadata

    out: dict[str, str | None] = {}
    for name in LIBRARIES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def describe() -> dict[str, Any]:
    """This process's platform: `{cpu, torch_cpu_capability, versions, python}`."""
    import torch

    return {"cpu": cpu(), "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(), "versions": versions(),
            "python": _stdlib_platform.python_version()}


def platform_id(description: dict[str, Any]) -> str:
    """12 hex digits of sha256 over the description's canonical JSON."""
    text = json.dumps(description, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def check_environment(wanted: dict[str, str], found: dict[str, str | None] | None = None) -> None:
    """One-line error when a library version differs from the amendment's `run_environment`, with the fix."""
    found = versions() if found is None else found
    wrong = {k: found.get(k) for k, v in wanted.items() if found.get(k) != str(v)}
    if wrong:
        pins = " ".join(f"{k}=={str(v).split('+')[0]}" for k, v in wanted.items())
        raise ValueError(f"run environment: {', '.join(f'{k} {v} (wanted {wanted[k]})' for k, v in wrong.items())}; "
                         f"the protocol's runs use one set of versions so that a platform is a CPU: "
                         f"pip install {pins}")
