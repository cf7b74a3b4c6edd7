"""The model cut of split learning (PartialFL's baselines): which parameters sit on the
client side (vanilla: encoders and projectors; U-shaped: also the head), the forward passes
of each side, the server's loss, the batch schedule of a session, and packing/unpacking the
cut-layer activations into messages. The protocol that uses them is
:mod:`mmfl.algorithms.split`."""

from __future__ import annotations


import torch
from torch import Tensor, nn

from mmfl.algorithms.multimodal import masked_ce
from mmfl.data.base import PRESENT
from mmfl.core.message import Message
from mmfl.models.multimodal import any_present, branch_of

CLIENT_MODULES = ("encoders", "proj")  # the client side of the cut; everything else is the server's
U_FRONT, U_TAIL = ("encoders",), ("classifier", "heads")  # U-shaped: the client's two ends; proj + fusion: the server's
ACT = "act/"  # client -> server: cut-layer activations of modality m (rows holding m)
GRAD = "grad/"  # server -> client: d loss / d act/<m>
LABELS = "labels"  # client -> server: the batch's labels (vanilla only)
REP, ZREP, GRAD_REP = "rep", "z/", "grad_rep"  # U-shaped: fusion output down, projector outputs down, its gradient up


def is_client_key(key: str, u_shaped: bool = False) -> bool:
    """Whether a state-dict key of the multimodal model is on the client side of the cut(s)."""
    top = key.split(".", 1)[0]
    if u_shaped:
        return top == "classifier" or (top in U_FRONT + U_TAIL and branch_of(key) is not None)
    return top in CLIENT_MODULES and branch_of(key) is not None


def client_keys(keys, holds, u_shaped: bool = False) -> list[str]:
    """The client-side keys of a client holding ``holds``: vanilla, the encoders and projectors
    of its modalities; U-shaped, its encoders and heads and the joint classifier."""
    return [k for k in keys if is_client_key(k, u_shaped) and branch_of(k) in (*holds, None)]


def batch_schedule(n: int, batch_size: int, epochs: int) -> list[tuple[int, int, int]]:
    """``(epoch, start, stop)`` of each mini-batch, positions in that epoch's shuffle;
    like :func:`~mmfl.core.training.local_train`, a batch of one is skipped (BatchNorm)
    unless the data has a single sample."""
    out = []
    for e in range(epochs):
        for s in range(0, n, batch_size):
            stop = min(s + batch_size, n)
            if stop - s < 2 and n >= 2:
                continue
            out.append((e, s, stop))
    return out


def client_forward(model: nn.Module, inputs: dict[str, Tensor], u_shaped: bool = False) -> dict[str, Tensor]:
    """The cut-layer activations of the held modalities: ``proj[m](encoders[m](x_m))`` ``[B, d]``,
    or U-shaped the encoder outputs ``encoders[m](x_m)`` (a padded sequence's ``length/<m>`` masks
    its encoder, :meth:`~mmfl.models.multimodal.MultimodalModel.encode`). Only the rows holding
    ``m`` (``present/<m>``) are encoded; the others are zeros and never sent (the cut of a
    sample that lacks ``m`` does not exist)."""
    if u_shaped:
        return {m: model.encode_present(m, inputs) for m in model.holds if m in inputs}
    return {m: model.encode_present(m, inputs, model.proj[m]) for m in model.holds if m in inputs}


def middle_forward(model: nn.Module, acts: dict[str, Tensor], present: dict[str, Tensor | None],
                   batch: int) -> tuple[Tensor, dict[str, Tensor], dict[str, Tensor]]:
    """U-shaped server side: ``(rep, z, masks)``, the projectors on the full-batch encoder
    outputs ``acts[m]`` and the fusion of the masked slots, as :meth:`MultimodalModel.forward`
    computes them (the projectors are row-wise, so a missing row's zeros change no other row)."""
    device, dtype = model.classifier.weight.device, model.classifier.weight.dtype
    masks = {m: (p.to(device=device, dtype=torch.bool).reshape(batch) if p is not None
                 else torch.ones(batch, dtype=torch.bool, device=device)) for m, p in present.items()}
    z = {m: model.proj[m](a) for m, a in acts.items()}
    zeros = torch.zeros(batch, model.feat_dim, device=device, dtype=dtype)
    slots = [torch.where(masks[m].unsqueeze(1), z[m], zeros) if m in z else zeros for m in model.modalities]
    return model.fusion(slots), z, masks


def server_forward(model: nn.Module, acts: dict[str, Tensor], present: dict[str, Tensor | None],
                   batch: int) -> dict:
    """Fusion + joint classifier over full-batch activations ``acts[m]`` ``[B, d]``, the path of
    :meth:`MultimodalModel.forward` after the projectors (``present[m]``: per-sample mask or
    None = every row; a missing modality's slot, and a sample's missing slot, is zeros)."""
    device, dtype = model.classifier.weight.device, model.classifier.weight.dtype
    masks = {m: (p.to(device=device, dtype=torch.bool).reshape(batch) if p is not None
                 else torch.ones(batch, dtype=torch.bool, device=device)) for m, p in present.items()}
    zeros = torch.zeros(batch, model.feat_dim, device=device, dtype=dtype)
    slots = [torch.where(masks[m].unsqueeze(1), acts[m], zeros) if m in acts else zeros for m in model.modalities]
    rep = model.fusion(slots)
    logits = model.classifier(model.dropout(rep))
    return {"logits": logits, "rep": rep, "mod_reps": acts, "present": masks}


def server_loss(model: nn.Module, out: dict, labels: Tensor, probe: bool) -> Tensor:
    """MFedAvg's objective: cross-entropy of the joint output + the heads' probes on detached
    activations (:class:`~mmfl.algorithms.multimodal.MultimodalClient`, term by term)."""
    logits = out["logits"]
    task = masked_ce(logits, labels, any_present(out["present"]))  # rows holding no modality: no loss
    if not probe:
        return task + logits.sum() * 0.0
    total = logits.new_zeros(())
    for m in model.modalities:
        if m in out["mod_reps"]:
            total = total + masked_ce(model.heads[m](out["mod_reps"][m].detach()), labels, out["present"][m])
    return task + total


def activation_message(acts: dict[str, Tensor], inputs: dict[str, Tensor], labels: Tensor,
                       send_labels: bool = True) -> Message:
    """``sl_forward``'s reply: each modality's activations of the rows holding it, its mask
    (only where the data has one) and the labels (U-shaped: the batch size instead)."""
    arrays = {}
    for m, a in acts.items():
        mask = inputs.get(PRESENT + m)
        if mask is not None:
            mask = mask.to(torch.bool).reshape(-1)
            arrays[PRESENT + m] = mask
            a = a[mask]
        arrays[ACT + m] = a.detach()
    if send_labels:
        arrays[LABELS] = labels
        return Message(arrays=arrays)
    return Message(arrays=arrays, scalars={"batch_size": int(labels.shape[0])})


def unpack_activations(msg: Message) -> tuple[dict[str, Tensor], dict[str, Tensor], dict, Tensor | None, int]:
    """``(leaves, full, present, labels, B)``: the received activations as leaves requiring grad,
    scattered into full-batch ``[B, d]`` tensors (zeros where a sample lacks ``m``), the masks,
    the labels (None U-shaped) and the batch size."""
    labels = msg.arrays.get(LABELS)
    b = int(labels.shape[0]) if labels is not None else int(msg.scalars["batch_size"])
    leaves, full, present = {}, {}, {}
    for key in sorted(k for k in msg.arrays if k.startswith(ACT)):
        m = key[len(ACT):]
        leaf = msg.arrays[key].detach().clone().requires_grad_(True)
        mask = msg.arrays.get(PRESENT + m)
        if mask is None:
            full[m] = leaf
        else:
            mask = mask.to(torch.bool).reshape(b)
            rows = mask.nonzero(as_tuple=True)[0]
            full[m] = leaf.new_zeros(b, leaf.shape[1]).index_put((rows,), leaf)
        leaves[m], present[m] = leaf, mask
    return leaves, full, present, labels, b


def rows_of(t: Tensor, mask: Tensor | None) -> Tensor:
    return t[mask.to(torch.bool).reshape(-1)] if mask is not None else t
