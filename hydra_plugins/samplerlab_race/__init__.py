"""samplerlab's race sweeper for Hydra: ``python -m runner -m hydra/sweeper=race ...``.

``hydra_plugins`` is a namespace package (no ``__init__.py``), as Hydra's plugin discovery
requires; this module keeps to the plugin's surface and leaves the race to
:mod:`experiments.race`."""
