"""The raw side of a config: a TOML file read into a dict and ``--set key=value`` overrides
applied to it, before any validation. Imports no torch and no registry (only the standard
library), so that a missing or malformed file is reported at once (``mmfl run nope.toml``);
:mod:`mmfl.config` validates the result.
"""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path
from typing import Any

from mmfl.errors import ConfigError


def parse_override(item: str) -> tuple[list[str], Any]:
    """``"algorithm.mu=5"`` -> (["algorithm", "mu"], 5). Values are TOML literals,
    falling back to a plain string (``data.name=mfeat``)."""
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected key=value")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"--set {item!r}: empty key")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key.split("."), value


def load_raw(path: str | Path | None) -> dict:
    if path is None:
        return {}
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: config file not found")
    try:
        return tomllib.loads(p.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{p}: not valid TOML ({e})") from None


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    raw = copy.deepcopy(raw)
    for item in overrides:
        keys, value = parse_override(item)
        node = raw
        for k in keys[:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {item!r}: {k} is not a table")
        node[keys[-1]] = value
    return raw
