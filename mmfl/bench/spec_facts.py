"""Fields of a table spec's templates (:mod:`mmfl.bench.spec`) read off a planned run's configuration
rather than off its results, ``<ns>.<group>@<setting>@<method>.<path>`` (the run of the group's first
seed; ``@`` separates, so keys may hold dots):

- ``resolved.<run>.<path>``: the resolved config (:func:`mmfl.config.resolve`, defaults filled in),
  attributes or keys by ``path`` (``resolved.fig@digits-private@partialfl.algorithm.params.server_lr``);
- ``clients.<run>``: the number of clients of its federation (:func:`mmfl.data.federation.build_federation`);
- ``train_bytes.<run>.<modality>``: the bytes of its training split's modality as float32 (``labels``:
  as int64): what collecting the raw data would upload;
- ``setting_file.<group>@<setting>``: the setting's first config file, relative to the grid's root.

Each is computed once per report (a federation is built, a data set loaded)."""

from __future__ import annotations

import functools
import os

from mmfl.errors import ConfigError


def _run(b, ref: str) -> tuple[str, str, str]:
    parts = ref.split("@")
    if len(parts) != 3:
        raise ConfigError(f"table spec: a run field is <group>@<setting>@<method>, got {ref!r}")
    return parts[0], parts[1], parts[2]


@functools.lru_cache(maxsize=32)
def _resolved(b, ref: str):
    from mmfl.config import resolve

    g, setting, method = _run(b, ref)
    return resolve(b.config(g, method, setting))


def _get(obj, path: str):
    for k in path.split(".") if path else []:
        obj = obj[k] if isinstance(obj, dict) else getattr(obj, k)
    return obj


def _split(rest: str) -> tuple[str, str]:
    """``<group>@<setting>@<method>.<path>`` -> (run, path): the path starts after the method's first dot."""
    head, _, tail = rest.partition("@")
    setting, _, tail = tail.partition("@")
    method, _, path = tail.partition(".")
    return f"{head}@{setting}@{method}", path


def resolved_field(b, rest: str):
    ref, path = _split(rest)
    return _get(_resolved(b, ref), path)


@functools.lru_cache(maxsize=32)
def clients_field(b, rest: str) -> int:
    from mmfl.data.federation import build_federation

    return build_federation(_resolved(b, rest)).num_clients


@functools.lru_cache(maxsize=8)
def _train(b, ref: str):
    from mmfl.data import DATASETS

    cfg = _resolved(b, ref)
    return DATASETS.get(cfg.data.name).factory(cfg.data.params).train


def train_bytes_field(b, rest: str) -> int:
    ref, mod = _split(rest)
    train = _train(b, ref)
    return 8 * len(train) if mod == "labels" else train.features[mod][0].numel() * 4 * len(train)


def setting_file_field(b, rest: str) -> str:
    g, _, s = rest.partition("@")
    return os.path.relpath(b.grid.settings(g)[s].config[0], b.grid.root)


FIELDS = {"resolved": resolved_field, "clients": clients_field, "train_bytes": train_bytes_field,
          "setting_file": setting_file_field}
KINDS: dict = {}
