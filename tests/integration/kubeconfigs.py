"""Kubeconfigs as the tests hand them around."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import yaml


def embedded_kubeconfig(path: Path) -> bytes:
    """The kubeconfig at ``path`` with its certificate files embedded, as a Secret holds it."""
    config: dict[str, Any] = yaml.safe_load(path.read_text())
    for section, keys in (
        ("clusters", ("certificate-authority",)),
        ("users", ("client-certificate", "client-key")),
    ):
        for entry in config[section]:
            inner = entry["cluster" if section == "clusters" else "user"]
            for key in keys:
                if key in inner:
                    inner[f"{key}-data"] = base64.b64encode(Path(inner.pop(key)).read_bytes()).decode()
    return yaml.safe_dump(config).encode()
