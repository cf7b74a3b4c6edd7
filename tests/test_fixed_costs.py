"""A short run pays no fixed cost it does not need (issue 17 item 6): a fresh process that runs
a tiny experiment end to end imports neither ``torch._dynamo`` (torch.optim's first optimizer,
1-1.5 s; mmfl.core.optim avoids it) nor matplotlib (the accuracy plot, 0.5-1 s; drawn by
``mmfl report RUN`` instead). The cells of report fixed_costs in benchmarks/perf/measures.toml measure both."""

import subprocess
from conftest import patience
import sys

CODE = """
import sys
import mmfl.api as api
res = api.run({}, set=["data.name=digits", "partition.num_clients=3", "model.name=mlp", "model.hidden=[16]",
                         "train.local_epochs=1", "train.batch_size=128", "rounds=2", "threads=1",
                         "algorithm.name=ALGO", "output_dir=OUT", "name=r"], progress=False)
assert res.summary["rounds"] == 2
print(sorted(m for m in ("torch._dynamo", "matplotlib") if m in sys.modules))
"""


def _heavy_after_run(tmp_path, algo: str) -> str:
    out = subprocess.run([sys.executable, "-c", CODE.replace("ALGO", algo).replace("OUT", str(tmp_path))], capture_output=True,
                         text=True, timeout=patience(300))
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


def test_a_short_run_imports_neither_dynamo_nor_matplotlib(tmp_path):
    assert _heavy_after_run(tmp_path, "moon") == "[]"
