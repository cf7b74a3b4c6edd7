"""The privacy check against crafted leaks (issue 15, item 5): every leak of a private
modality's rows or of the labels below must be refused with one line naming the reply key
and what matched, and the legitimate replies of the algorithms (weights, gradients,
representations, prototypes, counts, metrics) must pass."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mmfl.config import PrivacyConfig
from mmfl.core.message import Message
from mmfl.data.base import ArrayDataset
from mmfl.engine.privacy import PrivacyChecker, PrivacyError

C = 10
N = 300
_g = torch.Generator().manual_seed(7)
# "audio" [1, 8, 16] (128 values, private), "image" [1, 6, 6] (shareable); smooth rows, like spectrograms
_audio = torch.randn(N, 1, 8, 16, generator=_g).cumsum(-1) * 0.3 + 2.0
SHARED = ArrayDataset({"audio": _audio, "image": torch.rand(N, 1, 6, 6, generator=_g)},
                      torch.randint(0, C, (N,), generator=_g))
CLIENT = SHARED.subset(torch.arange(0, N, 2))
OTHER = SHARED.subset(torch.arange(1, N, 2))
RULES = PrivacyConfig(modalities={"audio": "private", "image": "shareable"})
X = CLIENT.get()[0]["audio"]  # [150, 1, 8, 16]
Y = CLIENT.get()[1]  # [150]
W = torch.randn(64, 50, generator=_g)  # other content around a leak


def refusal(arrays=None, scalars=None, rules=RULES, data=CLIENT) -> str | None:
    """The one-line error of the check, or None if the reply passes."""
    try:
        PrivacyChecker(rules).check(Message(arrays=arrays or {}, scalars=scalars or {}), data,
                                    cid=4, route="train", num_classes=C)
    except PrivacyError as e:
        return str(e)
    return None


def _u8(x):
    lo, hi = x.min(), x.max()
    return ((x - lo) / (hi - lo) * 255).round().to(torch.uint8)


ROW_LEAKS = {
    "exact": lambda: X[:3],
    "times_1.0001": lambda: X * 1.0001,
    "negated": lambda: -X[:5],
    "affine": lambda: 3.0 * X[:4] + 2.0,
    "negative_affine": lambda: -0.01 * X[10:12] + 7.0,
    "small_shift": lambda: X[:2] + 1e-3,
    "float16": lambda: X.half(),
    "bfloat16": lambda: X[:6].bfloat16(),
    "float64": lambda: X[:3].double(),
    "int_scaled": lambda: (X[:3] * 1000).int(),
    "uint8_quantized": lambda: _u8(X[:3]),
    "bytes_as_uint8": lambda: X[:2].contiguous().view(torch.uint8),
    "bytes_as_int32": lambda: X[:2].contiguous().view(torch.int32),
    "float16_bytes_as_int16": lambda: X[:2].half().view(torch.int16),
    "float16_bytes_as_uint8": lambda: X[:2].half().contiguous().view(torch.uint8),
    "float32_bytes_as_float16": lambda: X[:2].contiguous().view(torch.float16),
    "transposed_2d": lambda: X[:9].reshape(9, -1).t(),
    "swapped_axes": lambda: X[:4].transpose(2, 3),
    "stack_axes_permuted": lambda: X[:5].permute(2, 3, 0, 1),
    "batch_axis_last": lambda: X[:5].permute(1, 2, 3, 0).contiguous().reshape(-1),
    "flattened_among_weights": lambda: torch.cat([W.flatten(), X[[5]].flatten(), W.flatten()]),
    "stack_shifted_by_one_value": lambda: torch.cat([torch.tensor([0.5]), X[:4].flatten()]),
    "stack_shifted_by_seven": lambda: torch.cat([torch.zeros(7), X[:2].flatten()])[:-3],
    "partial_row": lambda: X[7].flatten()[30:100],
    "one_row_among_noise": lambda: torch.cat([torch.randn(20, 1, 8, 16, generator=_g), X[[13]], torch.randn(5, 1, 8, 16)]),
    "permuted_subset": lambda: X[torch.randperm(150, generator=_g)[:7]],
    "rows_as_128_columns": lambda: X[:3].reshape(3, 128).t().contiguous().reshape(64, 6),
    "negated_float16_swapped": lambda: (-X[:3]).half().transpose(2, 3),
}


@pytest.mark.parametrize("leak", ROW_LEAKS)
def test_private_rows_are_refused_whatever_the_transformation(leak):
    msg = refusal({"model/w": W, "x": ROW_LEAKS[leak]()})
    assert msg is not None, leak
    assert msg.startswith("client 4, route train: array 'x' carries private modality 'audio' raw data (")
    assert msg.endswith('privacy.modalities.audio = "private")') and "\n" not in msg


def test_private_rows_in_scalars_are_refused():
    row = X[3].flatten()
    msg = refusal(scalars={"num_examples": 150, "debug": json.dumps(row.tolist())})
    assert msg.startswith("client 4, route train: string scalar 'debug' (the numbers it holds) carries "
                          "private modality 'audio' raw data (")
    csv = ",".join(f"{v:.4f}" for v in row.tolist())
    assert "string scalar 'debug'" in refusal(scalars={"debug": csv})
    many = {f"v{i}": float(v) for i, v in enumerate(row.tolist())}
    assert "the 128 numeric scalars ('v0', 'v1', 'v2', ...), read in order, carries private modality 'audio'" \
        in refusal(scalars=many)


def test_the_refusal_says_what_matched():
    assert refusal({"x": X[:3]}) == ("client 4, route train: array 'x' carries private modality 'audio' raw data "
                                     "(privacy.modalities.audio = \"private\")")  # an exact copy
    msg = refusal({"x": X[:2].half().view(torch.int16)})
    assert "sample 0 of the client's" in msg and "its bytes read as float16" in msg
    assert "|corr| 1.0000" in refusal({"x": -X[[4]]}) and "sample 8 of the client's" in refusal({"x": X[[8]] * 2})


LABELS = {
    "in_order": (lambda: Y, "in order"),
    "float": (lambda: Y.float(), "in order"),
    "float64": (lambda: Y.double(), "in order"),
    "uint8_cast": (lambda: Y.to(torch.uint8), "in order"),
    "plus_one": (lambda: Y + 1, "in order, ids mapped one-to-one"),
    "affine_float": (lambda: Y.float() * 0.1 - 3.0, "in order, ids mapped one-to-one"),
    "classes_renamed": (lambda: torch.tensor([3, 7, 1, 0, 9, 2, 8, 6, 5, 4])[Y], "in order, ids mapped one-to-one"),
    "negated": (lambda: -Y, "in order, ids mapped one-to-one"),
    "one_hot": (lambda: F.one_hot(Y, C), "one-hot, in order"),
    "one_hot_transposed": (lambda: F.one_hot(Y, C).t().float(), "one-hot, classes first, in order"),
    "one_hot_pm1": (lambda: 2.0 * F.one_hot(Y, C) - 1, "argmax over classes (soft labels), in order"),
    "soft_labels": (lambda: F.softmax(3.0 * F.one_hot(Y, C) + 0.1 * torch.randn(150, C, generator=_g), 1),
                    "argmax over classes (soft labels), in order"),
    "soft_labels_transposed": (lambda: F.softmax(3.0 * F.one_hot(Y, C).float(), 1).t(),
                               "argmax over classes (soft labels), classes first, in order"),
    "bytes_as_uint8": (lambda: Y.contiguous().view(torch.uint8), "its bytes read as int64, in order"),
    "float_bytes_as_int32": (lambda: Y.float().view(torch.int32), "in order, ids mapped one-to-one"),
    "permuted_shifted": (lambda: Y[torch.randperm(150, generator=_g)] + 2, "permuted or a subset, ids shifted by 2"),
    "permuted": (lambda: Y[torch.randperm(150, generator=_g)], "permuted or a subset"),
}


@pytest.mark.parametrize("leak", LABELS)
def test_labels_are_refused_in_any_encoding(leak):
    make, how = LABELS[leak]
    msg = refusal({"model/w": W, "stats": make()})
    assert msg is not None, leak
    assert msg.startswith(f"client 4, route train: array 'stats' carries the client's labels ({how}"), msg
    assert msg.endswith('privacy.labels = "private")') and "\n" not in msg


def test_labels_in_scalars_are_refused():
    ys = Y.tolist()
    cases = {
        "json": {"debug": json.dumps(ys)},
        "csv": {"debug": ",".join(map(str, ys))},
        "digits": {"debug": "".join(map(str, ys))},
        "words_and_numbers": {"debug": "labels of my data: " + " ".join(map(str, ys))},
    }
    for name, scalars in cases.items():
        msg = refusal(scalars={"num_examples": 150, **scalars})
        assert msg is not None and msg.startswith("client 4, route train: string scalar 'debug' (the numbers it "
                                                  "holds) carries the client's labels (in order"), name
    many = {f"v{i}": int(v) for i, v in enumerate(ys)}
    assert "the 150 numeric scalars ('v0', 'v1', 'v2', ...), read in order, carries the client's labels (in order" \
        in refusal(scalars=many)
    floats = {f"v{i}": float(v) + 0.5 for i, v in enumerate(ys)}
    assert "carries the client's labels (in order, ids mapped" in refusal(scalars=floats)
    digits = "".join(map(str, ys))
    assert digits[0] != "0"  # an integer drops a leading zero
    assert "scalar 'packed' (its decimal digits) carries the client's labels (in order" in \
        refusal(scalars={"packed": int(digits)})


# ----------------------------------------------------------------------------- what passes

def _trained_model_reply() -> dict[str, torch.Tensor]:
    """What the algorithms send: weights after a few steps on the client's data (an encoder
    of the private modality), their update, representations and prototypes of the private
    modality, counts."""
    torch.manual_seed(0)
    enc = nn.Sequential(nn.Flatten(), nn.Linear(128, 32), nn.ReLU(), nn.Linear(32, 16))
    conv = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 14, 16))
    head = nn.Linear(16, C)
    bn = nn.BatchNorm1d(16)
    start = {k: v.clone() for k, v in enc.state_dict().items()}
    opt = torch.optim.SGD([*enc.parameters(), *conv.parameters(), *head.parameters(), *bn.parameters()], lr=0.1)
    for i in range(0, 150, 16):  # batch 16, one epoch; also batch 1 for the last step
        loss = F.cross_entropy(head(bn(enc(X[i:i + 16]) + conv(X[i:i + 16]))), Y[i:i + 16])
        opt.zero_grad()
        loss.backward()
        opt.step()
    grads = {f"grad/{k}": p.grad.clone() for k, p in enc.named_parameters()}
    z = enc(X).detach()
    arrays = {f"enc/{k}": v for k, v in enc.state_dict().items()}
    arrays.update({f"conv/{k}": v for k, v in conv.state_dict().items()})
    arrays.update({f"head/{k}": v for k, v in head.state_dict().items()})
    arrays.update({f"bn/{k}": v for k, v in bn.state_dict().items()})
    # updates past the first layer (a first-layer update row of a unit active for one sample
    # only is that sample: refused, see test_an_update_row_of_one_sample_is_that_sample)
    arrays.update({f"delta/{k}": v - start[k] for k, v in enc.state_dict().items() if not k.startswith("1.")})
    arrays.update({k: v for k, v in grads.items() if not k.startswith("grad/1.")})
    hist = torch.bincount(Y, minlength=C)
    arrays.update({
        "reps/audio": z,  # representations of the private modality (PartialFL's design relies on these passing)
        "reps/audio_fp16": z.half(),
        "protos": torch.stack([z[Y == c].mean(0) if (Y == c).any() else torch.zeros(16) for c in range(C)]),
        "proto_counts": hist,
        "class_counts": hist.float(),
        "public_logits": head(z[:40]).detach(),  # logits on (here: 40) rows, not all the client's
        "image": CLIENT.get()[0]["image"],  # the shareable modality
        "other_clients_audio": OTHER.get()[0]["audio"][:20],
        "zeros": torch.zeros(150), "ones": torch.ones(128), "arange": torch.arange(150),
    })
    return arrays


def test_legitimate_replies_pass():
    scalars = {"num_examples": 150, "train_loss": 0.5, "steps": 10, "accuracy": 0.75, "lr": 0.1,
               "mu": 0.01, "tag": "fedavg round 3", "seed": 1234567}
    assert refusal(_trained_model_reply(), scalars) is None


def test_embeddings_of_the_private_modality_are_what_the_check_cannot_see():
    """The documented limit: a learned map of a private row (an encoder's output) passes,
    even a linear one; the check compares content, not what can be inferred from it."""
    lin = torch.randn(128, 128, generator=_g)
    assert refusal({"z": X[:5].reshape(5, 128) @ lin}) is None
    assert refusal({"z": torch.roll(X[:5].reshape(5, 128), 1, dims=1) @ lin}) is None


def test_an_update_row_of_one_sample_is_that_sample():
    """Gradient leakage: the first layer's gradient on one sample is ``delta x^T``, each row
    a multiple of the sample; sent as an update it is refused (batch 1, a unit active for
    one sample only). Weights (the same update plus the initial weights) pass."""
    lin = nn.Linear(128, 8)
    F.cross_entropy(lin(X[[21]].reshape(1, 128)), Y[[21]].clamp(max=7)).backward()
    assert "sample 21 of the client's, |corr| 1.0000" in refusal({"grad/w": lin.weight.grad})
    assert refusal({"w": lin.weight.detach() - 0.1 * lin.weight.grad}) is None
