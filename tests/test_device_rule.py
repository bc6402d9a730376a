"""The device rule: only platforms touch device modules.

`torch.cuda.*`, `torch.get_device_module(...)` and `.cuda()` may appear only in platform
code (`rl_core/platform.py`, the integrations) and in files that declare themselves a
platform shim with a line ``# device-rule: platform shim`` (e.g. a CPU shim that patches
a library's hard-coded CUDA calls). Everything else asks `rl_core.platform.get_platform()`.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NEEDLES = ("torch.cuda.", "get_device_module(", ".cuda()")
SHIM_MARK = "# device-rule: platform shim"


def test_no_device_module_calls_outside_platforms():
    offenders = []
    for path in sorted((ROOT / "packages").glob("*/src/**/*.py")):
        if path.name == "platform.py":
            continue
        text = path.read_text(encoding="utf-8")
        if SHIM_MARK in text:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            code = line.split("#", 1)[0]
            if any(needle in code for needle in NEEDLES):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, "device-module calls outside the platform:\n" + "\n".join(offenders)
