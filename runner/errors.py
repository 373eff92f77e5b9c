"""The error convention: a user's mistake (config, data, store) is reported in one or two lines
that name the parameter, the value and the fix, and the process exits 2; a bug keeps its
traceback. The errors the runner raises are here, importable without Hydra; how the boundary
explains them, with Hydra's and OmegaConf's own, is :mod:`runner.explain`."""

from __future__ import annotations

EXIT_USER_ERROR = 2


class UserError(Exception):
    """A mistake the user can fix: the message names the parameter, the value and the fix.
    A subclass may set ``exit_code`` (default :data:`EXIT_USER_ERROR`)."""


class EnvironmentFailure(UserError):
    """A user error that comes from where the run ran, not from its configuration (a full disk,
    a lost store): once that is fixed the same configuration can succeed, so a resumed sweep
    runs it again rather than replaying the failure."""


def config_error(key: str, message: str) -> UserError:
    """A config value refused: ``config error at '<key>': <message>``."""
    return UserError(f"config error at '{key}': {message}")
