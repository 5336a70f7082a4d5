"""How to add an optional extra to this gpumon, said the way this gpumon was installed.

The distribution (gpumon-datastall) is installed from a clone, not from a package index, so
`pip install 'gpumon-datastall[plot]'` fails ("No matching distribution found"). PEP 610's
direct_url.json says where an installed distribution came from: a message that names a missing
extra names that place, with the interpreter of this environment (a virtualenv's, or pipx's).
"""

from __future__ import annotations

import json
import shlex
import sys
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "gpumon-datastall"

PACKAGES = {
    "plot": ("matplotlib",),
    "bench": ("keras", "Pillow"),
    "k8s": ("grpcio", "protobuf"),
}
"""What each extra brings (setup.cfg's extras_require): what `pipx inject` needs by name."""


def source() -> tuple[str | None, bool]:
    """Where this gpumon was installed from (a local directory, or None for a package index or
    unknown) and whether it is an editable install."""
    here = Path(__file__).resolve().parents[2]
    tree = (str(here), True) if (here / "setup.cfg").exists() else (None, False)
    try:
        dist = metadata.distribution(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return tree  # run from a source tree (PYTHONPATH, `python -m gpumon` in a clone)
    direct = dist.read_text("direct_url.json")
    if not direct:
        # the egg-info an editable install leaves in its source tree (found first when that tree
        # is on the path): that tree; anywhere else, an install from a package index
        return tree if Path(str(dist.locate_file(""))).resolve() == here else (None, False)
    try:
        doc = json.loads(direct)
        url = str(doc.get("url", ""))
        editable = bool((doc.get("dir_info") or {}).get("editable"))
    except (ValueError, AttributeError):
        return None, False
    return (url.removeprefix("file://"), editable) if url.startswith("file://") else (None, False)


def install_hint(extra: str, *also: str) -> str:
    """The command that adds `extra` (and the packages `also`, e.g. torch) to this gpumon."""
    where, editable = source()
    if "/pipx/venvs/" in sys.prefix:  # pipx's own virtualenv: it adds packages by name
        return "pipx inject " + " ".join([DISTRIBUTION, *PACKAGES.get(extra, ()), *also])
    spec = f"{where or DISTRIBUTION}[{extra}]"
    words = [sys.executable, "-m", "pip", "install", *(["-e"] if editable and where else []), spec, *also]
    return " ".join(shlex.quote(w) for w in words)
