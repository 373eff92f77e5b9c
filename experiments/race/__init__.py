"""The race: which candidate (strategy, method, setting) is best on a validation split, with
seeds spent only where they decide. :mod:`~experiments.race.rule` is the elimination rule,
:mod:`~experiments.race.race` the rounds, :mod:`~experiments.race.simulate` its measured error
and power; the Hydra sweeper ``hydra/sweeper=race`` (``hydra_plugins/samplerlab_race``) runs
it through any launcher."""
