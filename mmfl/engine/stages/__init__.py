"""The round's stages, one idea a module; :mod:`mmfl.engine.pipeline` declares their order and
:class:`mmfl.engine.runner.Experiment` walks them (docs/architecture.md, "The round loop")."""
