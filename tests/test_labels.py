"""Labels checked at load: a manifest label column that is not classes is refused in one line
(unless ``data.label_type = "class"``), and for any data set the test classes unseen in training,
classes with few training rows and single-class clients are each named in one warning line."""

from __future__ import annotations

import numpy as np
import pytest

from mmfl.config import resolve
from mmfl.data import DATASETS
from mmfl.data.federation import build_federation
from mmfl.data.labels import FEW_ROWS, label_warnings
from mmfl.errors import DataError

try:
    from data_fixtures import write_manifest
except ImportError:  # tests/ imported as a package
    from tests.data_fixtures import write_manifest


def load(tmp_path, rows, name="m.csv", **values):
    write_manifest(tmp_path / name, rows)
    return DATASETS.get("manifest").factory(DATASETS.params("manifest", {"root": str(tmp_path), "manifest": name,
                                                                         **values}))


def test_continuous_labels_are_refused_unless_label_type_is_class(tmp_path):
    rows = [{"x": f"{i} 1", "label": f"{0.5 * i:.2f}", "split": "train" if i < 8 else "test"} for i in range(10)]
    with pytest.raises(DataError, match=r"m\.csv: row 2, column 'label': label '0\.50' is not a whole number: 5 of "
                                        r"10 labels have a fractional part.*a regression target\?.*data\.label_type "
                                        r"= \"class\""):
        load(tmp_path, rows)
    b = load(tmp_path, rows, label_type="class")
    assert b.meta.num_classes == 10


def test_integer_valued_numbers_distinct_on_most_rows_are_refused(tmp_path):
    rows = [{"x": f"{i} 1", "label": f"{i}.0", "split": "train" if i % 4 else "test"} for i in range(24)]
    with pytest.raises(DataError, match=r"column 'label': 24 distinct numeric labels for 24 labelled rows \(more "
                                        r"than half the rows"):
        load(tmp_path, rows)
    assert load(tmp_path, rows, label_type="class").meta.num_classes == 24
    few = [dict(r, label=f"{i % 3}.0") for i, r in enumerate(rows)]  # 3 classes written as floats: fine
    assert load(tmp_path, few).meta.class_names == ["0", "1", "2"]
    tiny = [dict(r, label=str(i)) for i, r in enumerate(rows[:8])]  # 8 distinct < 10: a tiny set keeps them
    assert load(tmp_path, tiny).meta.num_classes == 8


def test_labels_mixing_numbers_and_names_are_refused(tmp_path):
    rows = [{"x": [i, 1], "label": [1, "cat", 2, "dog"][i % 4], "split": "train" if i < 6 else "test"}
            for i in range(8)]
    rows.insert(0, {"x": [9, 9], "label": "", "split": "train"})  # dropped (no label): the row numbers stay the file's
    with pytest.raises(DataError, match=r"m\.jsonl: column 'label': labels mix numbers \(4 rows, e\.g\. row 2: 1\) "
                                        r"and names \(4 rows, e\.g\. row 3: 'cat'\)"):
        load(tmp_path, rows, name="m.jsonl")
    assert load(tmp_path, rows, name="m.jsonl", label_type="class").meta.class_names == ["1", "2", "cat", "dog"]


def test_label_warnings_name_every_case_in_one_line_per_kind():
    train = np.array([0] * 10 + [1] * 2 + [2] * 10 + [3] * 4)
    test = np.array([0, 1, 2, 4, 4, 5])
    clients = [np.array([0, 0, 2]), np.array([2, 2]), np.array([1, 3]), np.array([], dtype=np.int64)]
    lines = label_warnings(train, test, 6, ["a", "b", "c", "d", "e", "f"], clients)
    assert lines == [
        "2 class(es) in the test split have no training row: 'e' (2 test rows), 'f' (1 test rows); no model can "
        "predict them, so 3 of 6 test rows (50.0 %) count as errors",
        f"2 class(es) have fewer than {FEW_ROWS} training rows: 'b' (2), 'd' (4); too few to learn them reliably",
        "1 of 4 clients hold a single class: client 1: 'c' (2 rows); their local training sees one label "
        "(a label-skew partition does this on purpose; otherwise raise partition.beta or use fewer clients)"]
    assert len(label_warnings(train, test, 6, [], clients, single_class_ok=True)) == 2
    many = label_warnings(np.arange(12).repeat(5), None, 12, [], [np.array([c]) for c in range(12)])
    assert many == ["12 of 12 clients hold a single class: client 0: 0 (1 rows), 1: 1 (1 rows), 2: 2 (1 rows), "
                    "3: 3 (1 rows), 4: 4 (1 rows), 5: 5 (1 rows), 6: 6 (1 rows), 7: 7 (1 rows), 8: 8 (1 rows), "
                    "9: 9 (1 rows) and 2 more; their local training sees one label (a label-skew partition does "
                    "this on purpose; otherwise raise partition.beta or use fewer clients)"]
    assert label_warnings(np.array([0, 1] * 10), np.array([0, 1]), 2, [], [np.array([0, 1])] * 3) == []


def test_build_federation_prints_the_label_warnings_for_any_data_set(tmp_path, capsys):
    rows = [{"x": f"{i} 1", "label": lab, "client": k, "split": "train"}
            for i, (lab, k) in enumerate([("a", "u1")] * 6 + [("b", "u2")] * 6 + [("a", "u2")] * 3 + [("c", "u2")] * 2)]
    rows += [{"x": "1 1", "label": lab, "client": "", "split": "test"} for lab in ("a", "b", "c", "d")]
    write_manifest(tmp_path / "m.csv", rows)
    cfg = resolve({"name": "x", "data": {"name": "manifest", "root": str(tmp_path), "manifest": "m.csv",
                                         "classes": ["a", "b", "c", "d"]},
                   "partition": {"name": "natural"}, "model": {"name": "mlp"}, "output_dir": str(tmp_path / "r")})
    capsys.readouterr()
    build_federation(cfg)
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "mmfl: warning: 1 class(es) in the test split have no training row: 'd' (1 test rows); no model can predict "
        "them, so 1 of 4 test rows (25.0 %) count as errors",
        "mmfl: warning: 1 class(es) have fewer than 5 training rows: 'c' (2); too few to learn them reliably",
        "mmfl: warning: 1 of 2 clients hold a single class: client 0 (u1): 'a' (6 rows); their local training sees one "
        "label (a label-skew partition does this on purpose; otherwise raise partition.beta or use fewer clients)"]
    capsys.readouterr()
    build_federation(resolve({**cfg.to_dict(), "algorithm": {"name": "centralized"}}), pooled=True)
    assert len(capsys.readouterr().err.strip().splitlines()) == 2  # one pooled client: no single-class line


def test_a_packaged_data_set_loads_without_label_warnings(capsys):
    cfg = resolve({"name": "x", "data": {"name": "digits"}, "partition": {"name": "iid", "num_clients": 3},
                   "model": {"name": "mlp"}})
    capsys.readouterr()
    build_federation(cfg)
    assert capsys.readouterr().err == ""
