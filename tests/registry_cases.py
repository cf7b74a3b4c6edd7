"""The registered algorithms by the federation they run in (``Server.runs_on``), for the tests
that run every algorithm (tests/test_device.py, tests/test_manifest_missing_runs.py): their lists
come from the registry, so a new algorithm file needs no edit there (docs/architecture.md,
"Adding an algorithm"; tests/test_adding_an_algorithm.py checks it)."""

from __future__ import annotations

from mmfl.algorithms import ALGORITHMS

SETTINGS = ("single", "multimodal", "public", "pair", "shareable")


def shipped() -> list[str]:
    """Every registered algorithm but the throwaway ones other test files register (``test_*``)."""
    return [n for n in ALGORITHMS.names() if not n.startswith("test_")]


def runs_on(name: str) -> str:
    setting = ALGORITHMS.get(name).factory.server.runs_on
    assert setting in SETTINGS, f"{name}: Server.runs_on = {setting!r}, not one of {SETTINGS}"
    return setting


def by_setting() -> dict[str, list[str]]:
    """setting -> the shipped algorithms that run in it."""
    out: dict[str, list[str]] = {s: [] for s in SETTINGS}
    for name in shipped():
        out[runs_on(name)].append(name)
    return out
