"""mmfl: multimodal federated learning.

Quick start (docs/api.md)::

    import mmfl

    res = mmfl.run("experiment.toml", rounds=3, algorithm__name="moon")
    res.metrics          # one row per round (pandas)
    res.summary          # final/best accuracy, bytes, time
    res.model()          # the final server model
    mmfl.load_run("runs/demo").evaluate()

``import mmfl`` is cheap: the API (:mod:`mmfl.api`) is imported on first use.
"""

from mmfl._version import __version__  # noqa: F401  (the package version)

# name -> attribute of mmfl.api, loaded on first access (PEP 562)
_API = {"run": "run", "load_run": "load_run", "configure": "configure", "Result": "Result",
        "list": "list_entries", "registries": "registries", "partition": "partition"}

__all__ = ["__version__", *_API]


def __getattr__(name: str):
    if name in _API:
        from mmfl import api

        return getattr(api, _API[name])
    raise AttributeError(f"module 'mmfl' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_API))
