"""The error convention: a user's mistake (config, data, store) is reported in one or two lines
that name the parameter, the value and the fix, and the process exits 2; a bug keeps its
traceback. ``HYDRA_FULL_ERROR=1`` shows the traceback of a user error too."""

from __future__ import annotations

import sys
from typing import NoReturn

from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf.errors import OmegaConfBaseException

EXIT_USER_ERROR = 2


class UserError(Exception):
    """A mistake the user can fix: the message names the parameter, the value and the fix.
    A subclass may set ``exit_code`` (default :data:`EXIT_USER_ERROR`)."""


class EnvironmentFailure(UserError):
    """A user error that comes from where the run ran, not from its configuration (a full disk,
    a lost store): once that is fixed the same configuration can succeed, so a resumed sweep
    runs it again rather than replaying the failure."""


def is_user_error(error: BaseException) -> bool:
    return isinstance(
        error,
        (UserError, ConfigCompositionException, MissingConfigException, OmegaConfBaseException),
    )


def explain(error: BaseException) -> str:
    """At most two lines for a user error, whatever raised it."""
    if isinstance(error, MissingConfigException) and error.options:
        first = str(error).splitlines()[0]
        return f"{first}\nchoose one of: {', '.join(error.options)}"
    lines = [line for line in str(error).splitlines() if line.strip()]
    cause = error.__cause__
    if isinstance(error, ConfigCompositionException) and isinstance(cause, OmegaConfBaseException):
        # Hydra says what failed; OmegaConf's first line says why ("Key 'epoch' not in ...").
        lines = lines[:2] + [str(cause).splitlines()[0]]
        if len(lines) == 3:  # "Could not override X." + "To append ... use +X" + why
            lines = [f"{lines[0]} {lines[2]}", lines[1]]
    return "\n".join(lines[:2])


def exit_with(error: BaseException) -> NoReturn:
    """Print the user error in at most two lines and exit 2."""
    print(f"samplerlab: {explain(error)}", file=sys.stderr, flush=True)
    sys.exit(getattr(error, "exit_code", EXIT_USER_ERROR))
