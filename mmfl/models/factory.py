"""A run's model factory: the registered model of ``[model]`` (or of a client's
``[[client_models]]`` entry), built for the modalities a client holds, with the run's
seeded initial weights."""

from __future__ import annotations

import inspect
from typing import Callable

import torch
from torch import nn

from mmfl.errors import ConfigError
from mmfl.models import MODELS
from mmfl.schema import ExperimentConfig
from mmfl.seeds import derive_seed


def model_factory(cfg: ExperimentConfig, meta, device: torch.device | None = None) -> Callable[..., nn.Module]:
    """``make(holds=None, group=None, meta=None)`` builds a model with the run's initial
    weights (seeded), on ``device`` (None: the CPU). The weights are drawn on the CPU from the
    seeded CPU generator and then moved, so a run starts from the same model on every device.

    ``group``: the ``[[client_models]]`` entry of the client (None: ``[model]``, which is
    also the server's model). ``holds``: the modalities of the client the model is for
    (None: all). A model factory that takes ``holds`` builds only those modalities'
    modules; any other model cannot serve a client missing a modality (ConfigError).
    ``meta``: the client's data set, when it is not the run's (``[[client_data]]``).
    """
    run_meta = meta

    def make(holds=None, group=None, meta=None) -> nn.Module:
        meta = meta or run_meta
        comp = cfg.model if group is None else cfg.client_models[group].model
        entry = MODELS.get(comp.name)
        partial = holds is not None and tuple(holds) != tuple(meta.modalities)
        if partial and "holds" not in inspect.signature(entry.factory).parameters:
            raise ConfigError(f"model.name: '{comp.name}' needs every modality on every client; "
                              f"use model 'multimodal' for clients holding only {', '.join(holds)}")
        with torch.random.fork_rng(devices=[]), torch.device("cpu"):
            torch.default_generator.manual_seed(derive_seed(cfg.run.seed, "model-init"))
            if partial:
                model = entry.factory(comp.params, meta, holds=list(holds))
            else:
                model = entry.factory(comp.params, meta)
        return model if device is None or device.type == "cpu" else model.to(device)

    return make
