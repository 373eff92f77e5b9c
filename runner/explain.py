"""How the boundary reports a user error: in at most two lines, Hydra's and OmegaConf's
config errors included (:func:`explain`), then exit 2 (:func:`exit_with`).
``HYDRA_FULL_ERROR=1`` shows the traceback of a user error too."""

from __future__ import annotations

import sys
from typing import NoReturn

from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf.errors import OmegaConfBaseException

from runner.errors import EXIT_USER_ERROR, UserError


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
