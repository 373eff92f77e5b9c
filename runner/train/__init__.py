"""The training core: one run's loop (:mod:`~runner.train.fit`), its state and checkpoints
(:mod:`~runner.train.state`), how batches reach the model (:mod:`~runner.train.feed`), frozen
backbones' cached features (:mod:`~runner.train.features`), the evaluation, the losses and the
decoupled classifier stages.

It imports torch, numpy, :mod:`samplers` and the modules below it (``runner.data``,
``runner.models``, ``runner.errors``, ...), never Hydra, OmegaConf or MLflow: the app
(:mod:`runner.app`) builds its parts from the config and hands it a recorder. Nothing is
imported here, so that importing one module of the core loads only what it needs.
"""
