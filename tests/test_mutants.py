"""The mechanism mutations (tests/mutations/*.toml) and their runner (scripts/mutants.py):

- every entry is valid against today's code (its ``find`` text occurs exactly once, its tests
  exist), so the list cannot rot silently, and docs/mechanisms.md's table is the list's rendering;
- a stale or malformed entry is one error line;
- the runner reports a mutation no test catches as SURVIVED (exit 1);
- the CI subset (``--fast``) is run: each of its mutations must fail its tests.

The whole list: ``.venv/bin/python scripts/mutants.py`` (docs/mechanisms.md, "Mutation checks").
"""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def runner():
    spec = importlib.util.spec_from_file_location("mmfl_mutants_script", ROOT / "scripts" / "mutants.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_entry_is_valid_and_the_doc_table_is_its_rendering():
    m = runner()
    entries = m.load()
    names = {e["name"] for e in entries}
    for required in ("moon-negative-pair", "fedcmi-distillation", "fedogm-coefficient", "scaffold-correction-sign",
                     "scaffold-client-variate-update", "partialfl-alignment", "pfedwireless-xi-update",
                     "fedmsplit-edge-step", "fedprox-half-mu", "robust-median", "dp-gaussian-noise",
                     "dp-update-clipping", "privacy-check-enforced"):
        assert required in names
    assert any(e["fast"] for e in entries)
    text = m.DOC.read_text()
    assert m.doc_with(entries, text) == text, "docs/mechanisms.md is stale: run .venv/bin/python scripts/mutants.py --doc"


ENTRY = '''[[mutation]]
name = "{name}"
mechanism = "m"
file = "mmfl/algorithms/fedprox.py"
find = "{find}"
replace = "{replace}"
tests = ["{test}"]
fast = true
{extra}'''
GOOD = dict(name="ok", find="mu: float = field(default=0.01", replace="mu: float = field(default=0.02",
            test="tests/test_algorithms.py::test_proximal_term_is_sum_of_squared_differences", extra="")


@pytest.mark.parametrize("change, message", [
    ({"find": "no such text"}, r"'find' occurs 0 times in mmfl/algorithms/fedprox.py"),
    ({"find": "mu"}, r"'find' occurs \d+ times"),
    ({"extra": 'colour = "red"\n'}, r"unknown keys \['colour'\]"),
    ({"name": "Not_Kebab"}, r"kebab-case"),
    ({"test": "tests/test_algorithms.py::test_gone"}, r"no function test_gone in tests/test_algorithms.py"),
    ({"test": "tests/test_nowhere.py::test_x"}, r"not a node id of an existing file"),
    ({"replace": "mu: float = field(default=0.02 +"}, r"the mutated mmfl/algorithms/fedprox.py does not compile"),
])
def test_a_stale_or_malformed_entry_is_one_error_line(tmp_path, change, message):
    m = runner()
    (tmp_path / "a.toml").write_text(ENTRY.format(**{**GOOD, **change}))
    with pytest.raises(m.ListError, match=message) as err:
        m.load(tmp_path, ROOT)
    assert "\n" not in str(err.value)
    (tmp_path / "a.toml").write_text(ENTRY.format(**GOOD))
    (tmp_path / "b.toml").write_text(ENTRY.format(**GOOD))
    with pytest.raises(m.ListError, match=r"b.toml: mutation 'ok': duplicate name \(also in .*a.toml\)"):
        m.load(tmp_path, ROOT)


def test_a_mutation_no_test_catches_survives_and_fails_the_runner(capsys):
    m = runner()
    # an equivalent mutant (a comment): the test passes, so the runner must say SURVIVED and exit 1
    entry = {"name": "equivalent", "file": "mmfl/algorithms/fedprox.py", "find": "def proximal_term(",
             "replace": "def proximal_term(  # a comment\n", "list": "test",
             "tests": ["tests/test_algorithms.py::test_proximal_term_is_sum_of_squared_differences"]}
    assert m.run([entry], jobs=1, timeout=300) == 1
    out = capsys.readouterr().out
    assert "| equivalent | SURVIVED |" in out and "not killed: equivalent" in out


@pytest.mark.slow
def test_the_fast_subset_kills_every_mutation():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "mutants.py"), "--fast"], cwd=ROOT,
                       capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "SURVIVED" not in r.stdout
