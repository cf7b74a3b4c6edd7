"""``mmfl flower new DIR CONFIG``: an mmfl experiment as a stand-alone Flower app.

The folder it writes has the layout of a Flower Hub app (``flwr new @account/app`` downloads
the same shape; ``flwr app publish DIR`` uploads it): a ``pyproject.toml`` whose
``[tool.flwr.app]`` names the ServerApp and ClientApp, a Python package holding them, and a
README. The package is two import lines per app, as ``mmfl/flower/app/`` is: the code is the
installed mmfl's (``dependencies = ["mmfl[flower]"]``), and the experiment is data, not code:
the resolved mmfl config sits in ``[tool.flwr.app.config]`` as ``mmfl-config`` (TOML text), so
``flwr run DIR`` runs it with no ``--run-config``, in Flower's simulation runtime or on a
deployment, unchanged. ``mmfl-set`` (``key=value`` pairs separated by spaces, shell quoting)
overrides values of it for one run: ``flwr run DIR --run-config 'mmfl-set="rounds=3 seed=1"'``;
both apps apply it (:func:`mmfl.flower.client_app.config_text`).

Nothing here imports Flower: writing the folder needs only mmfl.
"""

from __future__ import annotations

import re
from pathlib import Path

import tomli_w

from mmfl._version import __version__
from mmfl.errors import MMFLError
from mmfl.schema import ExperimentConfig

NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9-]{0,31}")  # Flower's app-name rule (flwr app publish, flwr build)
DESCRIPTION_MAX = 200  # characters Flower Hub shows (flwr app publish warns above it)

SERVER_PY = '''"""The ServerApp: mmfl's round loop (mmfl.flower.server_app) on this app's run config."""

from mmfl.flower.server_app import make_server_app

app = make_server_app()
'''

CLIENT_PY = '''"""The ClientApp: mmfl's client code (mmfl.flower.client_app) on this app's run config."""

from mmfl.flower.client_app import make_client_app

app = make_client_app()
'''


def package_name(name: str) -> str:
    """The Python package of app ``name`` (``my-app`` -> ``my_app``)."""
    return name.lower().replace("-", "_")


def check_name(name: str) -> str:
    if not NAME_RE.fullmatch(name):
        raise MMFLError(f"flower new: app name {name!r}: a Flower app name starts with a letter, holds only "
                        "letters, digits and hyphens, and has at most 32 characters (give --name)")
    return name


def describe(cfg: ExperimentConfig) -> str:
    n = getattr(cfg.partition.params, "num_clients", None)
    who = f"{n} clients" if isinstance(n, int) else "its clients"
    text = f"mmfl {cfg.algorithm.name} on {cfg.data.name}, {who}, {cfg.run.rounds} rounds (multimodal federated learning)"
    return text[:DESCRIPTION_MAX]


def pyproject(cfg: ExperimentConfig, name: str, publisher: str, config_text: str) -> str:
    pkg = package_name(name)
    doc = {
        "build-system": {"requires": ["hatchling"], "build-backend": "hatchling.build"},
        "project": {"name": name, "version": "1.0.0", "description": describe(cfg), "license": "MIT",
                    "dependencies": [f"mmfl[flower]>={__version__}"]},
        "tool": {
            "hatch": {"build": {"targets": {"wheel": {"packages": ["."]}}}},
            "flwr": {"app": {
                "publisher": publisher,
                "components": {"serverapp": f"{pkg}.server_app:app", "clientapp": f"{pkg}.client_app:app"},
                "config": {"mmfl-config": config_text, "mmfl-set": "", "mmfl-overwrite": False,
                           "mmfl-resume": False},
            }},
        },
    }
    head = (f"# A Flower app running the mmfl experiment `{cfg.run.name}` ({cfg.algorithm.name} on "
            f"{cfg.data.name}); written by `mmfl flower new`.\n# The experiment is the `mmfl-config` value below "
            "(the resolved mmfl config). See README.md.\n")
    return head + tomli_w.dumps(doc, multiline_strings=True)


def readme(cfg: ExperimentConfig, name: str) -> str:
    return f"""# {name}

{describe(cfg)}.

This is a [Flower](https://flower.ai) app written by `mmfl flower new`. Its ServerApp and
ClientApp are mmfl's (two import lines in `{package_name(name)}/`); the experiment is the
`mmfl-config` value in `pyproject.toml`, the resolved mmfl config of run `{cfg.run.name}`.

## Install

mmfl and Flower, in every environment that runs a SuperLink or a SuperNode:

```bash
pip install torch==2.13.0
pip install "mmfl[flower]"   # or, from an mmfl checkout: pip install -e ".[flower]"
pip install -e .             # this app
```

## Run in Flower's simulation runtime

```bash
flwr run .                   # one virtual SuperNode per mmfl client by default of your federation
flwr run . --run-config 'mmfl-set="rounds=3 seed=1"'   # override config values for one run
```

Each virtual SuperNode `k` of `num-supernodes = P` hosts the mmfl clients `c` with `c % P == k`.

## Run on a deployment

Start each SuperNode with the node config naming its partition (and where that machine keeps
the data, if not where the config says):

```bash
flower-supernode --superlink HOST:9092 --root-certificates ca.crt \\
    --node-config 'partition-id=0 num-partitions=4 data.root="/data/{cfg.data.name}"'
flwr run . my-superlink
```

Start the SuperLink with `--disable-runtime-dependency-installation` so that Flower uses the
installed mmfl. The run folder (metrics, checkpoints, summary) is written where the ServerApp
runs, at the config's `output_dir` / `name`. Each SuperNode builds its own clients' data from the
config; no client data leaves a node (mmfl's `[privacy]` check runs there).

## Publish

`flwr app publish .` uploads this folder to Flower Hub (after `flwr login`).
"""


def write_app(cfg: ExperimentConfig, dest: Path, name: str | None = None, publisher: str = "mmfl") -> Path:
    """Write the Flower app of ``cfg`` into ``dest`` (a new or empty folder); its path."""
    dest = Path(dest)
    name = check_name(name or dest.resolve().name)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", publisher):
        raise MMFLError(f"flower new: --publisher {publisher!r}: letters, digits, '-', '_', '.' only")
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise MMFLError(f"flower new: {dest} exists and is not an empty folder; give a new folder")
    files = {"pyproject.toml": pyproject(cfg, name, publisher, cfg.to_toml()), "README.md": readme(cfg, name)}
    pkg = dest / package_name(name)
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text(f'"""The Flower app {name}: mmfl\'s ServerApp and ClientApp."""\n')
    (pkg / "server_app.py").write_text(SERVER_PY)
    (pkg / "client_app.py").write_text(CLIENT_PY)
    for fname, text in files.items():
        (dest / fname).write_text(text)
    (dest / ".gitignore").write_text("__pycache__/\n*.fab\n")
    return dest
