"""The crafted-leak corpus (tests/privacy/corpus.toml, issue 27 item 1), run as data: every
probe marked ``refused`` is refused by the privacy check, every ``out_of_scope`` one passes
and is listed with its reason in docs/security.md, so the page states exactly what is
guaranteed and the corpus is its evidence."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from mmfl.config import PrivacyConfig
from mmfl.core.message import Message
from mmfl.data.base import ArrayDataset
from mmfl.engine.privacy import PrivacyChecker, PrivacyError

ROOT = Path(__file__).resolve().parents[1]
PROBES = tomllib.loads((ROOT / "tests" / "privacy" / "corpus.toml").read_text())["probe"]
C, N = 10, 300
_g = torch.Generator().manual_seed(7)
_audio = torch.randn(N, 1, 8, 16, generator=_g).cumsum(-1) * 0.3 + 2.0
SHARED = ArrayDataset({"audio": _audio, "image": torch.rand(N, 1, 6, 6, generator=_g)},
                      torch.randint(0, C, (N,), generator=_g))
CLIENT = SHARED.subset(torch.arange(0, N, 2))  # 150 rows
RULES = PrivacyConfig(modalities={"audio": "private", "image": "shareable"})
X, Y = CLIENT.get()[0]["audio"], CLIENT.get()[1]
W = torch.randn(64, 50, generator=_g)
DTYPES = {n: getattr(torch, n) for n in ("float16", "bfloat16", "float32", "float64", "int16", "int32", "int64",
                                          "uint8")}


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(1000 + int(seed))


def _change(t, k, seed):
    idx = torch.randperm(len(t), generator=_gen(seed))[:int(k)]
    out = t.clone()
    out[idx] = (out[idx] + 1 + torch.randint(0, C - 1, (len(idx),), generator=_gen(seed))) % C
    return out


def _quantize_u8(t):
    lo, hi = t.min(), t.max()
    return ((t - lo) / (hi - lo) * 255).round().to(torch.uint8)


OPS = {
    "rows": lambda t, a, b: t[int(a):int(b)],
    "values": lambda t, a, b: t[int(a):int(b)],
    "scale": lambda t, a: t * a,
    "shift": lambda t, b: t + b,
    "cast": lambda t, dt: t.to(DTYPES[dt]),
    "view": lambda t, dt: t.contiguous().view(DTYPES[dt]),
    "reshape": lambda t, *shape: t.reshape(*[int(s) for s in shape]),
    "transpose": lambda t, a, b: t.transpose(int(a), int(b)),
    "permute": lambda t, *dims: t.permute(*[int(d) for d in dims]),
    "flatten": lambda t: t.contiguous().reshape(-1),
    "prepend": lambda t, k, v: torch.cat([torch.full((int(k),), float(v)), t]),
    "between_weights": lambda t: torch.cat([W.flatten(), t, W.flatten()]),
    "among_noise": lambda t, a, b: torch.cat([torch.randn(int(a), *t.shape[1:], generator=_gen(a)), t,
                                              torch.randn(int(b), *t.shape[1:], generator=_gen(b))]),
    "permute_rows": lambda t, seed: t[torch.randperm(len(t), generator=_gen(seed))],
    "quantize_u8": _quantize_u8,
    "noise": lambda t, sigma, seed: t + sigma * torch.randn(t.shape, generator=_gen(seed)),
    "softmax": lambda t: F.softmax(t, 1),
    "one_hot": lambda t: F.one_hot(t, C),
    "relabel": lambda t, seed: torch.randperm(C, generator=_gen(seed))[t],
    "change": lambda t, k, seed: _change(t, k, seed),
    "add_columns": lambda t, k, v: torch.cat([t.to(torch.float32), torch.full((len(t), int(k)), float(v))], 1),
    "permute_columns": lambda t, seed: t[:, torch.randperm(t.shape[1], generator=_gen(seed))],
    "mix_columns": lambda t, seed: t.to(torch.float32) @ torch.randn(t.shape[1], t.shape[1], generator=_gen(seed)),
    "histogram": lambda t: torch.bincount(t, minlength=C),
    "arange": lambda t: torch.arange(len(t)),
}
BASES = {"labels": lambda: Y.clone(), "rows": lambda: X.clone(), "weights": lambda: W.clone()}
KEYS = {"name", "base", "ops", "carrier", "required", "expect", "reason"}


def _letters(i: int) -> str:
    return "".join(chr(97 + (i // 26 ** p) % 26) for p in (2, 1, 0))


def build(probe: dict) -> Message:
    t = BASES[probe["base"]]()
    for op, *args in probe.get("ops", []):
        t = OPS[op](t, *args)
    carrier = probe.get("carrier", "array")
    if carrier == "array":
        return Message(arrays={"model/w": W, "x": t}, scalars={"num_examples": len(Y)})
    values = t.reshape(-1).tolist()
    if carrier == "json":
        return Message(scalars={"num_examples": len(Y), "debug": json.dumps(values)})
    names = [f"v{i}" for i in range(len(values))] if carrier == "scalars" else \
        [_letters(i) for i in range(len(values))]
    items = list(zip(names, values))
    where = probe.get("required")
    if where is not None:
        pos = {"first": 0, "middle": len(items) // 2, "last": len(items)}[where]
        items[pos:pos] = [("num_examples", len(Y)), ("batch_size", 32)]
    return Message(scalars=dict(items))


def refusal(probe: dict) -> str | None:
    try:
        PrivacyChecker(RULES).check(build(probe), CLIENT, cid=4, route="train", num_classes=C)
    except PrivacyError as e:
        return str(e)
    return None


def test_the_corpus_is_well_formed():
    names = [p["name"] for p in PROBES]
    assert len(names) == len(set(names)), "duplicate probe names"
    for p in PROBES:
        assert set(p) <= KEYS and p["base"] in BASES and p["expect"] in ("refused", "out_of_scope"), p
        assert all(op in OPS for op, *_ in p.get("ops", [])), p
        assert (p["expect"] == "out_of_scope") == ("reason" in p), f"{p['name']}: out_of_scope needs a reason"
    assert sum(p["expect"] == "refused" for p in PROBES) >= 60


@pytest.mark.parametrize("probe", PROBES, ids=[p["name"] for p in PROBES])
def test_probe(probe):
    msg = refusal(probe)
    if probe["expect"] == "refused":
        assert msg is not None, f"{probe['name']}: passed the privacy check"
        assert msg.startswith("client 4, route train: ") and "\n" not in msg
    else:
        assert msg is None, f"{probe['name']} is listed out of scope ({probe['reason']}) but was refused: {msg}"


def test_docs_list_every_out_of_scope_probe():
    doc = (ROOT / "docs" / "security.md").read_text()
    missing = [p["name"] for p in PROBES if p["expect"] == "out_of_scope" and f"`{p['name']}`" not in doc]
    assert not missing, f"docs/security.md does not list these out-of-scope probes: {missing}"
