"""benchmarks/creamfl/rung_rounds.py: the rung's paired gain round by round, from run folders'
metrics.jsonl (tiny fixtures, not real runs)."""

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "creamfl" / "rung_rounds.py"


def _load():
    spec = importlib.util.spec_from_file_location("rung_rounds", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(raw: Path, name: str, values: list[float]) -> None:
    d = raw / name
    d.mkdir(parents=True)
    d.joinpath("metrics.jsonl").write_text("".join(
        json.dumps({"round": r + 1, "rsum_authors": v, "r1_sum": v / 3}) + "\n" for r, v in enumerate(values)))


def test_paired_gain_per_round_and_at_the_last_common_round(tmp_path, capsys):
    for s in range(3):
        _run(tmp_path, f"rung-mfeat-server_alone-s{s}", [10.0 + s, 20.0 + s, 30.0 + s, 40.0 + s])
        # CreamFL stopped at round 3 for seed 2: the last round every pair reached is 3
        _run(tmp_path, f"rung-mfeat-creamfl-s{s}", [12.0 + s, 21.0 + s + 0.1 * s, 31.0 + s][: 3 if s == 2 else 3]
             + ([] if s == 2 else [40.0 + s - 1]))
    assert _load().main(["--raw-dir", str(tmp_path), "--seeds", "0", "1", "2", "--rounds", "1", "4"]) == 0
    out = capsys.readouterr().out
    assert "s2: 3, 4" in out
    cells = [[x.strip() for x in ln.strip().strip("|").split("|")] for ln in out.splitlines()
             if ln.startswith("| ") and ln[2].isdigit()]
    rows = {(c[0], c[1]): c for c in cells}
    assert rows[("1", "R@1_sum")][2:5] == ["13.0", "11.0", "+2.0"]  # CreamFL, server alone, mean paired difference
    assert rows[("3", "R@1_sum")][4] == "+1.0" and ("2", "R@1_sum") not in rows  # the last round all three pairs reached
    r4 = rows[("4", "R@1_sum")]  # only seeds 0 and 1 reached round 4
    assert r4[4] == "-1.0" and r4[7] == "2"
