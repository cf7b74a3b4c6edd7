"""Encoders for sequences: ``[B, C, T]`` numeric series (1-D conv, GRU) and ``[B, L]`` token ids
(trainable embedding), each ``-> [B, feat_dim]`` with a ReLU at the output, like the other
encoders of :class:`~mmfl.models.multimodal.MultimodalModel`.

Padded sequences: ``lengths`` (int64 ``[B]``, the batch's ``features["length/<m>"]``, see
:data:`mmfl.data.base.LENGTH`) is the number of valid steps along the last axis; the
positions at or after it are padding and change no output (mechanism tests in
``tests/test_sequence_encoders.py``). ``lengths = None``: every step is valid. A length below
1 is taken as 1 (the first step, zero padding for an empty sequence).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

SEQUENCE_KINDS = ("conv1d", "gru")
TOKEN_KIND = "tokens"


def valid_mask(lengths: Tensor | None, steps: int, batch: int, device) -> Tensor:
    """Bool ``[B, T]``: True at the valid steps ``t < lengths[b]`` (all True without lengths)."""
    if lengths is None:
        return torch.ones(batch, steps, dtype=torch.bool, device=device)
    n = lengths.to(device=device, dtype=torch.long).reshape(batch).clamp(1, steps)
    return torch.arange(steps, device=device).unsqueeze(0) < n.unsqueeze(1)


def masked_mean_max(h: Tensor, mask: Tensor) -> Tensor:
    """``h`` ``[B, D, T]``, ``mask`` bool ``[B, T]`` -> ``[B, 2D]``: the mean and the max of
    ``h`` over the valid steps (every row has at least one)."""
    m = mask.unsqueeze(1).to(h.dtype)
    mean = (h * m).sum(-1) / m.sum(-1).clamp(min=1.0)
    mx = h.masked_fill(~mask.unsqueeze(1), float("-inf")).amax(-1)
    return torch.cat([mean, mx], dim=1)


def _relu_linear(a: int, b: int) -> nn.Linear:
    lin = nn.Linear(a, b)
    nn.init.kaiming_normal_(lin.weight, nonlinearity="relu")
    nn.init.zeros_(lin.bias)
    return lin


class Conv1dEncoder(nn.Module):
    """``[B, C, T]`` (or ``[B, T]``: one channel) -> per entry of ``channels``: conv1d(kernel,
    'same' zero padding) - ReLU - maxpool 2 (ceil), the padded steps set to 0 before every
    conv and pool -> masked mean and max over the valid steps -> Linear(2 c, feat_dim) -> ReLU.

    No BatchNorm: its batch statistics would mix in the padded steps. With zeros at the
    padded steps, a conv sees exactly the zero padding of the unpadded sequence, and after a
    ReLU a zero never wins a max over valid (>= 0) values, so a sequence padded from T to 2T
    gives the same embedding; the valid length after a pool is ceil(length / 2).
    """

    def __init__(self, shape: tuple[int, ...], channels: list[int], feat_dim: int, kernel: int = 5):
        super().__init__()
        shape = tuple(int(s) for s in shape)
        c_in = shape[0] if len(shape) == 2 else 1
        self.kernel = int(kernel)
        self.convs = nn.ModuleList()
        for c_out in channels:
            conv = nn.Conv1d(c_in, c_out, self.kernel, padding=self.kernel // 2)
            nn.init.kaiming_normal_(conv.weight, nonlinearity="relu")
            nn.init.zeros_(conv.bias)
            self.convs.append(conv)
            c_in = c_out
        self.out = _relu_linear(2 * c_in, feat_dim)

    def forward(self, x: Tensor, lengths: Tensor | None = None) -> Tensor:
        x = x.float()
        if x.dim() == 2:
            x = x.unsqueeze(1)
        b = x.shape[0]
        n = None if lengths is None else lengths.to(device=x.device, dtype=torch.long).reshape(b).clamp(1, x.shape[-1])
        for conv in self.convs:
            mask = valid_mask(n, x.shape[-1], b, x.device)
            x = torch.relu(conv(x * mask.unsqueeze(1).to(x.dtype)))
            x = x * mask.unsqueeze(1).to(x.dtype)
            x = nn.functional.max_pool1d(x, 2, ceil_mode=True) if x.shape[-1] > 1 else x
            if n is not None and x.shape[-1] != mask.shape[1]:
                n = torch.div(n + 1, 2, rounding_mode="floor")
        mask = valid_mask(n, x.shape[-1], b, x.device)
        return torch.relu(self.out(masked_mean_max(x, mask)))


class GRUEncoder(nn.Module):
    """``[B, C, T]`` (or ``[B, T]``) -> a unidirectional GRU over time (input size C, ``hidden``
    units, ``layers`` layers) -> its last layer's hidden state at the last valid step (with
    ``lengths``, ``pack_padded_sequence``: the padded steps are never computed) -> Linear(hidden,
    feat_dim) -> ReLU."""

    def __init__(self, shape: tuple[int, ...], hidden: int, feat_dim: int, layers: int = 1):
        super().__init__()
        shape = tuple(int(s) for s in shape)
        c_in = shape[0] if len(shape) == 2 else 1
        self.gru = nn.GRU(c_in, int(hidden), num_layers=int(layers), batch_first=True)
        self.out = _relu_linear(int(hidden), feat_dim)

    def forward(self, x: Tensor, lengths: Tensor | None = None) -> Tensor:
        x = x.float()
        if x.dim() == 2:
            x = x.unsqueeze(1)
        b, _, t = x.shape
        seq = x.transpose(1, 2)  # [B, T, C]
        if lengths is not None:  # packed: the GRU runs over the valid steps only
            n = lengths.detach().to(device="cpu", dtype=torch.long).reshape(b).clamp(1, t)
            seq = nn.utils.rnn.pack_padded_sequence(seq, n, batch_first=True, enforce_sorted=False)
        _, h = self.gru(seq)  # h: [layers, B, hidden], the state after each row's last (valid) step
        return torch.relu(self.out(h[-1]))


class TokenEncoder(nn.Module):
    """Token ids ``[B, L]`` (int64, 0 = pad) -> ``nn.Embedding(vocab_size, dim, padding_idx=0)``
    -> mean over the non-pad tokens (id != 0 and position < ``lengths``; an all-pad row gives
    zeros) -> Linear(dim, feat_dim) -> ReLU. ``vocab_size`` counts pad (0) and unknown (1); an id
    outside ``[0, vocab_size)`` is read as unknown."""

    def __init__(self, vocab_size: int, dim: int, feat_dim: int):
        super().__init__()
        self.vocab_size = int(vocab_size)
        self.embed = nn.Embedding(self.vocab_size, int(dim), padding_idx=0)
        self.out = _relu_linear(int(dim), feat_dim)

    def forward(self, x: Tensor, lengths: Tensor | None = None) -> Tensor:
        ids = x.long().reshape(x.shape[0], -1)
        mask = (ids != 0) & valid_mask(lengths, ids.shape[1], ids.shape[0], ids.device)
        ids = torch.where((ids >= 0) & (ids < self.vocab_size), ids, torch.ones_like(ids))  # out of range: unknown
        e = self.embed(ids)  # [B, L, dim]
        w = mask.unsqueeze(-1).to(e.dtype)
        pooled = (e * w).sum(1) / w.sum(1).clamp(min=1.0)
        return torch.relu(self.out(pooled))
