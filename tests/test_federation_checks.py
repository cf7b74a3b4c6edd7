"""Cross-checks of a federation: every ``[[client_data]]`` data set uses ``[data]``'s modality
names with the same per-sample shapes (after its frozen encoders), and ``[[client_models]]``
selects modalities the federation has. A mismatch is one ``mmfl: error:`` line naming both sides
(exit code 2), never a traceback in round 1 nor clients silently receiving nothing.

The data sets are throwaway ones registered for the test (tiny tensors): ``xpairs`` has an
``image`` and a text-like modality (its name and width are parameters) and a public set, like
``emoji_pairs``; a CreamFL run needs the clients' modalities to match the public set's."""

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from mmfl.cli import main
from mmfl.config import resolve
from mmfl.data import DATASETS
from mmfl.data.base import ArrayDataset, DatasetBundle, DatasetMeta
from mmfl.data.federation import build_federation
from mmfl.errors import ConfigError
from mmfl.registry import Entry


@dataclass
class XPairsParams:
    mods: list[str] = field(default_factory=lambda: ["image", "text"])
    text_dim: int = 8
    classes: int = 3
    public: bool = True
    label_prefix: str = "c"  # class names: <prefix>0, <prefix>1, ...


def xpairs(p: XPairsParams) -> DatasetBundle:
    g = torch.Generator().manual_seed(0)
    dims = {m: (p.text_dim,) if m != "image" else (6,) for m in p.mods}

    def split(n):
        return ArrayDataset({m: torch.randn(n, *d, generator=g) for m, d in dims.items()},
                            torch.arange(n) % p.classes)

    meta = DatasetMeta(name="xpairs", num_classes=p.classes, modalities=dims,
                       class_names=[f"{p.label_prefix}{k}" for k in range(p.classes)])
    return DatasetBundle(split(24), split(9), meta, public=split(12) if p.public else None)


@pytest.fixture(autouse=True)
def _xpairs(monkeypatch):
    monkeypatch.setitem(DATASETS._entries, "xpairs", Entry("xpairs", xpairs, XPairsParams, "test pairs"))


def config(tmp_path, client_data: dict, **extra) -> dict:
    return {"name": "x", "rounds": 1, "threads": 1, "output_dir": str(tmp_path), "clients_per_round": 4,
            "data": {"name": "xpairs"}, "partition": {"name": "iid", "num_clients": 2},
            "model": {"name": "multimodal", "feat_dim": 8, "mlp_hidden": [8]},
            "client_data": [{"data": {"name": "xpairs", "public": False, **client_data},
                             "partition": {"name": "iid", "num_clients": 2}}],
            "algorithm": {"name": "creamfl"}, "train": {"local_epochs": 1, "batch_size": 8}, **extra}


def write(tmp_path, raw) -> str:
    import tomli_w

    path = tmp_path / "x.toml"
    path.write_bytes(tomli_w.dumps(raw).encode())
    return str(path)


def cli_error(tmp_path, raw, capsys) -> str:
    """The CLI's exit code must be 2 and stderr one line; returns that line."""
    code = main(["run", write(tmp_path, raw), "--overwrite"])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("mmfl: error: "), err
    return err


def test_client_data_text_of_another_width_is_one_line_naming_both_sides(tmp_path, capsys):
    # before: a traceback in round 1 (mat1 and mat2 shapes cannot be multiplied)
    err = cli_error(tmp_path, config(tmp_path, {"mods": ["text"], "text_dim": 12}), capsys)
    assert "client_data[0].data: modality 'text' has shape (12,) but [data] 'text' has (8,)" in err


def test_client_data_modality_of_another_name_is_one_line_listing_data_modalities(tmp_path, capsys):
    # before: exit 0, and the 'tweet' clients received 0 bytes each round
    err = cli_error(tmp_path, config(tmp_path, {"mods": ["tweet"]}), capsys)
    assert "client_data[0]: modality 'tweet' is not one of [data]'s modalities (image, text)" in err


def test_client_data_with_data_modalities_and_shapes_runs(tmp_path, capsys):
    raw = config(tmp_path, {"mods": ["text"], "classes": 4})  # other classes: fine, same text width
    assert main(["run", write(tmp_path, raw), "--overwrite", "--no-progress"]) == 0, capsys.readouterr().err
    fed = build_federation(resolve(raw))
    assert fed.modalities_of(3) == ("text",) and fed.meta_of(3).num_classes == 4


def test_client_models_for_modalities_must_name_federation_modalities(tmp_path, capsys):
    raw = config(tmp_path, {"mods": ["text"]},
                 client_models=[{"for_modalities": ["txt"], "mlp_hidden": [4]}])
    err = cli_error(tmp_path, raw, capsys)
    assert "client_models[0].for_modalities: 'txt' is not a modality of this federation (image, text)" in err


def test_client_models_for_clients_beyond_the_federation_is_an_error(tmp_path):
    raw = config(tmp_path, {"mods": ["text"]}, client_models=[{"for_clients": [1, 7], "mlp_hidden": [4]}])
    with pytest.raises(ConfigError, match=r"client_models\[0\].for_clients: client 7 does not exist "
                                          r"\(the federation has clients 0..3\)"):
        build_federation(resolve(raw))


# ----------------------------------------------------------------------------- mmfl partition


def test_partition_labels_each_client_data_set_with_its_own_class_names(tmp_path, capsys):
    # before: every client's counts were labelled with [data]'s class names (CreamFL's Fashion-MNIST
    # and BBC News clients under emoji categories)
    raw = config(tmp_path, {"mods": ["text"], "classes": 4, "label_prefix": "news"})
    png = tmp_path / "parts.png"
    assert main(["partition", write(tmp_path, raw), "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    first, second = out.split("client_data[0] xpairs: iid partition, clients 2-3")
    assert "xpairs: iid partition, clients 0-1" in first
    head = [line for line in first.splitlines() if line.lstrip().startswith("client ")][0].split()
    assert head == ["client", "c0", "c1", "c2", "total"]
    head = [line for line in second.splitlines() if line.lstrip().startswith("client ")][0].split()
    assert head == ["client", "news0", "news1", "news2", "news3", "total"]
    rows = [r for r in map(str.split, second.splitlines()) if len(r) == 6 and r[0] in ("2", "3")]
    assert [r[0] for r in rows] == ["2", "3"] and sum(int(r[-1]) for r in rows) == 24  # global ids, all rows
    assert png.stat().st_size > 0


def test_plot_federation_has_one_titled_panel_per_data_set_with_its_classes(tmp_path):
    from mmfl.data.partition_report import source_groups

    raw = config(tmp_path, {"mods": ["text"], "classes": 4, "label_prefix": "news"})
    cfg = resolve(raw)
    fed = build_federation(cfg)
    groups = source_groups(fed, cfg)
    assert [g["ids"] for g in groups] == [[0, 1], [2, 3]]
    assert [g["counts"].shape for g in groups] == [(2, 3), (2, 4)]
    assert groups[1]["class_names"] == ["news0", "news1", "news2", "news3"]


def test_token_ids_against_float_features_of_the_same_width_is_one_line():
    from mmfl.data.base import DatasetMeta
    from mmfl.data.federation import check_source
    from mmfl.errors import ConfigError

    floats = DatasetMeta(name="a", num_classes=2, modalities={"text": (8,)}, class_names=["x", "y"], info={})
    tokens = DatasetMeta(name="b", num_classes=2, modalities={"text": (8,)}, class_names=["x", "y"],
                         info={"token_vocab_size": {"text": 50}})
    check_source(0, floats, floats)
    with pytest.raises(ConfigError, match=r"client_data\[0\].data: modality 'text' holds token ids"):
        check_source(0, tokens, floats)
