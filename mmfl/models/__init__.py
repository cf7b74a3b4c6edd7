"""Models. Every model maps a dict of modality tensors to a dict of outputs.

Contract (all registered models):

    out = model(inputs)          # inputs: {"image": [B, 1, 28, 28], ...}
    out["logits"]: [B, num_classes]
    out["rep"]:    [B, d]        # the representation R_w(x) MOON contrasts
                                 # (projection-head output where there is one)
    out["mod_logits"]: {m: [B, num_classes]}   # optional: one classifier per modality;
                                 # evaluate_model then adds accuracy/<m>, uar/<m>, class_accuracy/<m>
    out["present"]: {m: bool [B]}  # multimodal: the rows holding m (inputs["present/<m>"]);
    out["any_present"]: bool [B] | None  # rows holding any given modality (None: no mask given);
                                 # an absent row's mod_* outputs are zeros, never its input's values

A factory is ``factory(params, meta: DatasetMeta) -> nn.Module``.
"""

from mmfl.registry import Registry

MODELS: Registry = Registry("model")

__all__ = ["MODELS"]


def build_model(name: str, values: dict, meta):
    """Build model ``name`` from its config table ``values`` for a data set's ``meta``.

    Unknown names/keys and bad values raise :class:`~mmfl.errors.ConfigError`.
    Returns an ``nn.Module`` following the contract above.
    """
    params = MODELS.params(name, values)
    return MODELS.get(name).factory(params, meta)


__all__ += ["build_model"]

from mmfl.models import cnn, mlp, multimodal, resnet  # noqa: E402,F401  (register)
