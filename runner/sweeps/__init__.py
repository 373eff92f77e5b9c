"""A multirun's life: its parent MLflow run and the Hydra callback that opens and ends it
(:mod:`~runner.sweeps.callback`), and the training prefixes its jobs share, with their cache
(:mod:`~runner.sweeps.prefixes`)."""
