"""The optional parts of samplerlab (``pip install 'samplerlab[<extra>]'``) and the one line a
user gets, before any work, when a command asks for one that is not installed."""

from __future__ import annotations

import importlib.util

from runner.errors import UserError

# hydra/launcher=<name>: the Hydra plugin module that provides it, and the extra that installs it.
LAUNCHERS = {
    "joblib": ("hydra_plugins.hydra_joblib_launcher", "joblib"),
    "submitit_local": ("hydra_plugins.hydra_submitit_launcher", "slurm"),
    "submitit_slurm": ("hydra_plugins.hydra_submitit_launcher", "slurm"),
    "slurm": ("hydra_plugins.hydra_submitit_launcher", "slurm"),
    "ray": ("hydra_plugins.hydra_ray_launcher", "ray"),
    "ray_cluster": ("hydra_plugins.hydra_ray_launcher", "ray"),
    "ray_aws": ("hydra_plugins.hydra_ray_launcher", "ray"),
}


def installed(module: str) -> bool:
    """Whether ``module`` can be imported (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def require(module: str, extra: str, setting: str) -> None:
    """Raise a :class:`UserError` naming ``setting`` (what the user asked for) and the extra to
    install when ``module`` is missing."""
    if not installed(module):
        raise UserError(
            f"{setting}: needs {module.split('.')[-1]}, which is not installed\n"
            f"pip install 'samplerlab[{extra}]'"
        )


def check_launcher(arguments: list[str]) -> None:
    """A ``hydra/launcher=<name>`` among the command line's ``arguments`` whose plugin is missing
    is a :class:`UserError` naming its extra (Hydra alone would list the launchers it has)."""
    for argument in arguments:
        group, _, name = argument.partition("=")
        if group.lstrip("+~") == "hydra/launcher" and name in LAUNCHERS:
            module, extra = LAUNCHERS[name]
            require(module, extra, argument)
