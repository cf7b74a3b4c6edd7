"""A multimodal classifier: per-modality encoders, projectors and heads, a fusion
module and a joint classifier (FedCMI, Fan et al., section 3.2, and its baselines).

Submodules (their names are the state-dict prefixes module-wise aggregation and
the algorithms rely on; see :func:`module_of` / :func:`branch_of`):

- ``encoders[m]``: modality ``m`` -> ``[B, feat_dim]`` (CNN, MLP, 1-D conv, GRU or token
                   embedding, ReLU at the output; see :func:`default_encoder`)
- ``proj[m]``:     self projector (SP), ``[B, feat_dim] -> [B, feat_dim]``
- ``infil[m]``:    infiltration projector (IP), only with ``two_projector``
- ``heads[m]``:    per-modality classifier ``Linear(feat_dim, num_classes)``, shared
                   by the branch's SP and IP outputs
- ``fusion``:      fusion over the SP outputs of all the data set's modalities
                   (slots in sorted modality order)
- ``classifier``:  joint classifier ``Linear(fusion_out_dim, num_classes)``

Per-sample missing modalities (``inputs["present/<m>"]``, bool ``[B]``): each branch runs on
the rows holding its modality only (:meth:`MultimodalModel._branch`, :meth:`encode_present`),
so an absent row's values never reach an encoder (nor its batch norm statistics); its
``mod_feats/mod_reps/mod_logits`` rows are zeros and its fusion slot is the fill.

A client's model (``holds`` = the modalities it has) is the full model with the
branches (``encoders/proj/infil/heads``) of the other modalities deleted; it is
always built in full first, so a torch seed gives every client the same tensors.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from mmfl.data.base import DatasetMeta
from mmfl.errors import ConfigError
from mmfl.models import MODELS
from mmfl.models.multimodal_params import ENCODER_KINDS, FUSION_KINDS, PROJECTOR_KINDS, MultimodalParams  # noqa: F401
from mmfl.models.uncertainty import INIT_A, INIT_NOISE, UncertaintyHeads
from mmfl.models.fusion import FUSIONS, ConcatFusion, FiLMFusion, GatedFusion, SumFusion  # noqa: F401  (in __all__)
from mmfl.models.encoders import CNNEncoder, MLPEncoder, default_encoder, relu_init  # noqa: F401  (re-exported)
from mmfl.models.sequence import Conv1dEncoder, GRUEncoder, TokenEncoder

try:
    from mmfl.data.base import PRESENT
except ImportError:  # pragma: no cover - older mmfl.data.base
    PRESENT = "present/"
try:
    from mmfl.data.base import LENGTH
except ImportError:  # pragma: no cover - older mmfl.data.base
    LENGTH = "length/"

BRANCH_MODULES = ("encoders", "proj", "infil", "heads")

__all__ = [
    "BRANCH_MODULES", "CNNEncoder", "ConcatFusion", "Conv1dEncoder", "FiLMFusion", "GRUEncoder", "GatedFusion",
    "MLPEncoder", "MultimodalModel", "MultimodalParams", "SumFusion", "TokenEncoder", "branch_of",
    "default_encoder", "make_projector", "module_of", "multimodal",
]


# --------------------------------------------------------------------------- state-dict keys


def module_of(key: str) -> str:
    """The module a state-dict key belongs to.

    ``"encoders.image.net.0.weight" -> "encoders.image"``, ``"heads.audio.weight" ->
    "heads.audio"``, ``"fusion.fc.weight" -> "fusion"``, ``"classifier.bias" -> "classifier"``.
    """
    parts = key.split(".")
    if parts[0] in BRANCH_MODULES and len(parts) >= 2:
        return f"{parts[0]}.{parts[1]}"
    return parts[0]


def branch_of(key: str) -> str | None:
    """The modality of an ``encoders/proj/infil/heads`` key, else None."""
    parts = key.split(".")
    if parts[0] in BRANCH_MODULES and len(parts) >= 2:
        return parts[1]
    return None


# --------------------------------------------------------------------------- projectors (encoders: mmfl.models.encoders)


def any_present(present: dict[str, Tensor] | None) -> Tensor | None:
    """The rows holding at least one modality of ``present`` (modality -> bool ``[B]``); None
    (every row) without masks. A row holding none of the client's modalities gives no loss."""
    masks = [p for p in (present or {}).values() if p is not None]
    if not masks:
        return None
    out = masks[0]
    for p in masks[1:]:
        out = out | p
    return out


def make_projector(kind: str, dim: int) -> nn.Module:
    """``"mlp"``: Linear-ReLU-Linear (dim -> dim -> dim); ``"linear"``: Linear; ``"none"``: Identity."""
    if kind == "mlp":
        return relu_init(nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, dim)))
    if kind == "linear":
        return nn.Linear(dim, dim)
    if kind == "none":
        return nn.Identity()
    raise ConfigError(f"model.projector: must be one of {list(PROJECTOR_KINDS)}, got {kind!r}")


# --------------------------------------------------------------------------- model


class MultimodalModel(nn.Module):
    """Encoders, self/infiltration projectors, per-modality heads, fusion, joint classifier.

    Attributes: ``modalities`` (all the data set's modalities, sorted: the fusion
    slot order), ``shapes``, ``holds`` (the modalities this model has branches
    for), ``feat_dim``, ``num_classes``, ``two_projector``, ``fusion_kind``,
    ``fusion_out_dim``.
    """

    def __init__(self, shapes: dict[str, tuple[int, ...]], num_classes: int, feat_dim: int = 128,
                 encoders: dict[str, str] | None = None, cnn_channels: list[int] | None = None,
                 mlp_hidden: list[int] | None = None, projector: str = "mlp", two_projector: bool = False,
                 fusion: str = "concat", dropout: float = 0.0, uncertainty: bool = False,
                 uncertainty_init_noise: float = INIT_NOISE, uncertainty_init_ab: float = INIT_A,
                 conv1d_channels: list[int] | None = None, conv1d_kernel: int = 5, gru_hidden: int = 128,
                 gru_layers: int = 1, token_dim: int = 64, vocab_sizes: dict[str, int] | None = None):
        super().__init__()
        self.modalities = sorted(shapes)
        if not self.modalities:
            raise ConfigError("model 'multimodal': the data set has no modalities")
        for m in self.modalities:
            if "." in m or not m:
                raise ConfigError(f"model 'multimodal': modality name {m!r} cannot be a module name")
        self.shapes = {m: tuple(int(d) for d in shapes[m]) for m in self.modalities}
        self.num_classes = int(num_classes)
        self.feat_dim = int(feat_dim)
        self.two_projector = bool(two_projector)
        self.fusion_kind = fusion
        kinds = dict(encoders or {})
        unknown = [m for m in kinds if m not in self.shapes]
        if unknown:
            raise ConfigError(f"model.encoders: unknown modality {unknown[0]!r} "
                              f"(has: {', '.join(self.modalities)})")
        channels = [32, 64] if cnn_channels is None else list(cnn_channels)
        hidden = [256] if mlp_hidden is None else list(mlp_hidden)
        vocab = {m: int(v) for m, v in (vocab_sizes or {}).items() if m in self.shapes}
        seq_channels = [64, 64] if conv1d_channels is None else list(conv1d_channels)

        self.encoders = nn.ModuleDict()
        self.encoder_kinds: dict[str, str] = {}
        for m in self.modalities:
            shape = self.shapes[m]
            kind = kinds.get(m) or default_encoder(shape, m in vocab)
            self.encoder_kinds[m] = kind
            if kind in ("conv1d", "gru") and len(shape) not in (1, 2):
                raise ConfigError(f"model.encoders: modality {m!r} has shape {shape}; "
                                  f"{kind!r} needs (channels, time) or (time,)")
            if kind == "conv1d":
                self.encoders[m] = Conv1dEncoder(shape, seq_channels, self.feat_dim, conv1d_kernel)
            elif kind == "gru":
                self.encoders[m] = GRUEncoder(shape, gru_hidden, self.feat_dim, gru_layers)
            elif kind == "tokens":
                if m not in vocab:
                    raise ConfigError(f"model.encoders: {m} = 'tokens' needs token ids, but the data set gives "
                                      f"no vocabulary size for {m!r} (meta.info['token_vocab_size'])")
                if vocab[m] < 2:
                    raise ConfigError(f"model.encoders: {m}: vocabulary size {vocab[m]} (needs >= 2: pad, unknown)")
                self.encoders[m] = TokenEncoder(vocab[m], token_dim, self.feat_dim)
            elif kind == "cnn":
                if len(shape) not in (2, 3):
                    raise ConfigError(f"model.encoders: modality {m!r} has shape {shape}; "
                                      f"'cnn' needs (C, H, W) or (H, W)")
                self.encoders[m] = CNNEncoder(shape, channels, self.feat_dim, m)
            elif kind == "mlp":
                self.encoders[m] = MLPEncoder(shape, hidden, self.feat_dim)
            else:
                raise ConfigError(f"model.encoders: {m} must be one of {list(ENCODER_KINDS)}, got {kind!r}")
        self.proj = nn.ModuleDict({m: make_projector(projector, self.feat_dim) for m in self.modalities})
        if self.two_projector:
            self.infil = nn.ModuleDict({m: make_projector(projector, self.feat_dim) for m in self.modalities})
        else:
            self.infil = None
        self.heads = nn.ModuleDict({m: nn.Linear(self.feat_dim, self.num_classes) for m in self.modalities})
        if fusion not in FUSIONS:
            raise ConfigError(f"model.fusion: must be one of {list(FUSION_KINDS)}, got {fusion!r}")
        if fusion in ("film", "gated") and len(self.modalities) < 2:
            raise ConfigError(f"model.fusion: {fusion!r} needs at least two modalities, "
                              f"the data set has {self.modalities}")
        self.fusion = FUSIONS[fusion](self.feat_dim, len(self.modalities))
        self.fusion_out_dim = self.fusion.out_dim
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.classifier = nn.Linear(self.fusion_out_dim, self.num_classes)
        self.holds = list(self.modalities)
        # PCME's log-variance heads and match scalars a, b (mmfl.models.uncertainty), built last so
        # every other module draws the same initial tensors with or without them
        self.uncertainty = (UncertaintyHeads(self.modalities, self.feat_dim, uncertainty_init_noise,
                                             uncertainty_init_ab, uncertainty_init_ab) if uncertainty else None)

    def keep_only(self, holds) -> "MultimodalModel":
        """Delete the branches (encoders/proj/infil/heads) of modalities not in ``holds``."""
        holds = list(holds)
        unknown = [m for m in holds if m not in self.shapes]
        if unknown:
            raise ConfigError(f"model 'multimodal': client holds unknown modality {unknown[0]!r} "
                              f"(data set has: {', '.join(self.modalities)})")
        for m in list(self.holds):
            if m in holds:
                continue
            for name in BRANCH_MODULES:
                md = getattr(self, name)
                if md is not None and m in md:
                    del md[m]
            if self.uncertainty is not None:
                self.uncertainty.drop(m)
        self.holds = [m for m in self.modalities if m in holds]
        return self

    def encode(self, m: str, inputs: dict[str, Tensor], rows: Tensor | None = None) -> Tensor:
        """``encoders[m]`` on ``inputs[m]`` ``[B, *shape]`` with the padded sequence's valid lengths
        ``inputs["length/<m>"]`` (int64 ``[B]``; absent: every step valid) -> ``[B, feat_dim]``;
        ``rows`` (optional index or bool mask) selects rows of both first."""
        x, n = inputs[m], inputs.get(LENGTH + m)
        if rows is not None:
            x, n = x[rows], (None if n is None else n[rows])
        return self.encoders[m](x, n)

    def present_rows(self, m: str, inputs: dict[str, Tensor]) -> Tensor | None:
        """The index ``[n]`` of the rows of ``inputs`` that hold ``m`` (``"present/<m>"``), or
        None when every row does (no mask, or an all-True one)."""
        mask = inputs.get(PRESENT + m)
        if mask is None:
            return None
        rows = mask.to(dtype=torch.bool).reshape(-1).nonzero().squeeze(1)
        return None if int(rows.numel()) == int(mask.numel()) else rows

    def encode_present(self, m: str, inputs: dict[str, Tensor], then=None) -> Tensor:
        """``then(encoders[m](x))`` (``then``: e.g. the projector; None: identity) on the rows
        holding ``m`` only, zeros ``[B, .]`` at the others (with no mask: every row): what an
        absent row holds never reaches the encoder."""
        rows = self.present_rows(m, inputs)
        if rows is not None and int(rows.numel()) == 0:
            b = int(inputs[m].shape[0])
            return self.classifier.weight.new_zeros(b, self.feat_dim)
        f = self.encode(m, inputs, rows)
        if then is not None:
            f = then(f)
        if rows is None:
            return f
        return f.new_zeros((int(inputs[m].shape[0]), *f.shape[1:])).index_copy(0, rows, f)

    def fuse(self, slots: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """``(rep, logits)`` of the fusion + joint classifier over ``slots`` (modality ->
        ``[B, feat_dim]``); a modality without a slot gets zeros."""
        ref = next(iter(slots.values()))
        zeros = ref.new_zeros(ref.shape[0], self.feat_dim)
        rep = self.fusion([slots.get(m, zeros) for m in self.modalities])
        return rep, self.classifier(self.dropout(rep))

    def forward(self, inputs: dict[str, Tensor]) -> dict:
        """See the module doc; ``inputs``: modality -> ``[B, *shape]`` (any subset), optional
        per-sample masks ``"present/<m>"`` (bool ``[B]``) and valid lengths of padded sequences
        ``"length/<m>"`` (int64 ``[B]``)."""
        ref = next((inputs[m] for m in self.holds if m in inputs), None)
        if ref is None:
            ref = next((t for t in inputs.values() if isinstance(t, Tensor)), None)
        if ref is None:
            raise ValueError("multimodal model: inputs hold no tensor")
        b = int(ref.shape[0])
        device = self.classifier.weight.device
        feats: dict[str, Tensor] = {}
        reps: dict[str, Tensor] = {}
        mod_logits: dict[str, Tensor] = {}
        ip_reps: dict[str, Tensor] = {}
        ip_logits: dict[str, Tensor] = {}
        present: dict[str, Tensor] = {}
        masked = False
        for m in self.holds:
            if m not in inputs:
                continue
            mask = inputs.get(PRESENT + m)
            rows = None
            if mask is None:
                present[m] = torch.ones(b, dtype=torch.bool, device=device)
            else:
                masked = True
                present[m] = mask.to(device=device, dtype=torch.bool).reshape(b)
                rows = present[m].nonzero().squeeze(1)
                if int(rows.numel()) == b:
                    rows = None  # every row holds m: the unmasked computation
            outs = self._branch(m, inputs, rows, b)
            feats[m], reps[m], mod_logits[m] = outs[:3]
            if self.infil is not None:
                ip_reps[m], ip_logits[m] = outs[3:]

        zeros = torch.zeros(b, self.feat_dim, device=device, dtype=self.classifier.weight.dtype)
        slots = []
        for m in self.modalities:
            fill = self._fill(m, ip_reps, present, zeros)
            slots.append(torch.where(present[m].unsqueeze(1), reps[m], fill) if m in reps else fill)
        rep = self.fusion(slots)
        logits = self.classifier(self.dropout(rep))
        return {"logits": logits, "rep": rep, "features": rep, "mod_feats": feats, "mod_reps": reps,
                "mod_logits": mod_logits, "ip_reps": ip_reps, "ip_logits": ip_logits, "present": present,
                "any_present": any_present(present) if masked else None}  # None: no mask given, every row

    def _branch(self, m: str, inputs: dict[str, Tensor], rows: Tensor | None, b: int) -> list[Tensor]:
        """``[f, z, head(z)(, ip, head(ip))]`` of modality ``m`` ``[B, .]``: computed on the rows
        ``rows`` (index ``[n]``; None: every row) only and zero at the others, so the values an
        absent row holds never enter an encoder (its batch norm statistics included) nor any
        output; with no row present the branch is not run at all."""
        if rows is not None and int(rows.numel()) == 0:
            w = self.classifier.weight
            zf = w.new_zeros(b, self.feat_dim)
            zl = w.new_zeros(b, self.num_classes)
            return [zf, zf, zl] + ([zf, zl] if self.infil is not None else [])
        f = self.encode(m, inputs, rows)
        z = self.proj[m](f)
        outs = [f, z, self.heads[m](z)]
        if self.infil is not None:
            ip = self.infil[m](f)
            outs += [ip, self.heads[m](ip)]
        if rows is None:
            return outs
        return [t.new_zeros((b, *t.shape[1:])).index_copy(0, rows, t) for t in outs]

    def _fill(self, m: str, ip_reps: dict[str, Tensor], present: dict[str, Tensor], zeros: Tensor) -> Tensor:
        """The slot of modality ``m`` where a sample lacks it: the mean IP output of the
        sample's present other modalities (two_projector), else / if none, zeros."""
        others = [k for k in ip_reps if k != m]
        if not others:
            return zeros
        total = zeros
        count = torch.zeros(zeros.shape[0], 1, device=zeros.device, dtype=zeros.dtype)
        for k in others:
            mk = present[k].unsqueeze(1)
            total = total + torch.where(mk, ip_reps[k], zeros)
            count = count + mk.to(zeros.dtype)
        return total / count.clamp(min=1.0)


@MODELS.register("multimodal", MultimodalParams,
                 help="per-modality encoders + self/infiltration projectors + heads, fusion, joint classifier")
def multimodal(params: MultimodalParams, meta: DatasetMeta, holds=None) -> MultimodalModel:
    """The full model for all of ``meta.modalities``, then (``holds`` given) only those branches."""
    model = MultimodalModel(dict(meta.modalities), meta.num_classes, params.feat_dim, params.encoders,
                            params.cnn_channels, params.mlp_hidden, params.projector, params.two_projector,
                            params.fusion, params.dropout, params.uncertainty, params.uncertainty_init_noise,
                            params.uncertainty_init_ab, params.conv1d_channels, params.conv1d_kernel,
                            params.gru_hidden, params.gru_layers, params.token_dim,
                            dict((meta.info or {}).get("token_vocab_size") or {}))
    if holds is not None:
        model.keep_only(holds)
    return model
