"""Primitives below the algorithms: messages and their byte counts, local training and
evaluation loops, personalized evaluation, retrieval and VQA scoring, the wireless system
model, the batched-client contract, declared algorithm state and aggregation rules.

Imports here point down only (to :mod:`mmfl.data`, :mod:`mmfl.models` and the base
modules); the algorithms build on this package, the runtime (:mod:`mmfl.engine`) on both.
"""
