"""mmfl: multimodal federated learning.

Quick start::

    from mmfl.config import load_config
    from mmfl.engine.runner import Experiment

    cfg = load_config("experiment.toml", ["algorithm.name=moon"])
    summary = Experiment(cfg).run()
"""

__version__ = "0.1.0"
