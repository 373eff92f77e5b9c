"""The digits benchmark's race replayed on the full grid's values with its seeds in
:data:`ORDERS` random orders, by today's rule, stored as ``docs/results/race_orders.json`` for
the race tables to read (:mod:`scripts.race_tables`).

Replaying takes about a minute (7 settings x 1000 orders), so it is done when its inputs or the
rule change, not every time the tables are checked::

    python -m scripts.tables --replay      # replay, store, then re-render the tables

The stored file names its inputs (a digest of the grid's and the benchmark's artifacts and of the
race's code) and the settings each replay ran with; a table refuses a file replayed from other
inputs, code or settings (``python -m scripts.tables --check`` fails), and ``tests/test_tables.py``
replays the first orders of every setting again and compares them with the stored ones.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from scripts.artifacts import RESULTS, ROOT, load, values_of

ORDERS = 1000  # seed orders replayed: a share's binomial standard error is at most 1.6 points
NAME = "race_orders"
RULE_FIELDS = ("min_seeds", "max_seeds", "max_runs", "alpha", "delta", "prefer")


@dataclass(frozen=True)
class Replayed:
    """What the tables read of one replayed race."""

    advised: str
    survivors: tuple[str, ...]
    runs: int
    stop_reason: str
    certificate: float


def setting_changes(folder: Path = RESULTS) -> dict[str, dict[str, Any]]:
    """The replays the tables show, by name: each one's changes to the recorded race's
    ``min_seeds``, ``max_seeds`` and ``alpha`` (and :class:`RaceSettings`' defaults)."""
    budget = load("race_bench", folder)["race"]["max_runs"]
    changes: dict[str, dict[str, Any]] = {
        "rule alone, budget": {"max_runs": budget, "delta": 0.0},
        "rule alone, no budget": {"max_runs": None, "delta": 0.0},
        "defaults, budget": {"max_runs": budget},
    }
    for delta, min_seeds in ((0.0, 3), (1.0, 3), (2.0, 3), (2.0, 2)):
        changes[f"delta={delta:g} min_seeds={min_seeds}"] = {"min_seeds": min_seeds, "delta": delta}
    return changes


def _settings(record: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """The rule's settings of a replay: the recorded race's, ``changes`` over them, today's
    :class:`RaceSettings` defaults for the rest."""
    from experiments.race.settings import RaceSettings

    recorded = {k: record[k] for k in ("min_seeds", "max_seeds", "alpha")}
    chosen = dataclasses.asdict(RaceSettings(**{**recorded, **changes}))
    return {k: chosen[k] for k in RULE_FIELDS}


# The race's code the replays ran: a change of the rule changes what is stored.
RULE_SOURCES = ("race.py", "rule.py", "settings.py")


def _inputs_digest(folder: Path) -> str:
    """A digest of what the replays are a function of: the grid's and the benchmark's
    artifacts and the race's code (:data:`RULE_SOURCES`)."""
    digest = hashlib.sha256()
    for name in ("race_bench", "digits_grid"):
        digest.update((folder / f"{name}.json").read_bytes())
    for source in RULE_SOURCES:
        digest.update((ROOT / "experiments" / "race" / source).read_bytes())
    return digest.hexdigest()


def replay_setting(folder: Path, settings: dict[str, Any], orders: int) -> list[Replayed]:
    """The benchmark's race with ``settings`` replayed on the grid's values in the first
    ``orders`` of the seeded seed orders (:func:`experiments.race.race.seed_orders`)."""
    from experiments.race.race import Race, seed_orders
    from experiments.race.settings import RaceSettings

    bench = load("race_bench", folder)
    values = values_of(load("digits_grid", folder), bench["objective"])
    table = {(c, s): v for c, by_seed in values.items() for s, v in by_seed.items()}
    race = partial(Race, bench["race"]["record"]["candidates"], settings=RaceSettings(**settings))
    return [
        Replayed(r.advised, tuple(r.survivors), r.runs, str(r.stop_reason), r.certificate)
        for r in seed_orders(race, table, bench["grid"]["seeds"], orders)
    ]


def expected_settings(folder: Path = RESULTS) -> dict[str, dict[str, Any]]:
    """Every replay's full settings today, by name."""
    record = load("race_bench", folder)["race"]["record"]
    return {name: _settings(record, c) for name, c in setting_changes(folder).items()}


def _encoded(race: Replayed, candidates: list[str]) -> list[Any]:
    """``race`` as one short row of indices into ``candidates``: the advised candidate, the
    survivors (best mean first, as the race lists them), then the runs, the stop reason and
    the certificate."""
    survivors = [candidates.index(name) for name in race.survivors]
    advised = candidates.index(race.advised)
    return [advised, survivors, race.runs, race.stop_reason, race.certificate]


def _decoded(row: list[Any], candidates: list[str]) -> Replayed:
    advised, survivors, runs, stop_reason, certificate = row
    names = tuple(candidates[i] for i in survivors)
    return Replayed(candidates[advised], names, runs, stop_reason, certificate)


def write_replays(folder: Path = RESULTS) -> Path:
    """Replay every setting of :func:`setting_changes` in :data:`ORDERS` orders and store
    them in ``folder/race_orders.json``."""
    candidates = list(load("race_bench", folder)["race"]["record"]["candidates"])
    stored = {
        "inputs": _inputs_digest(folder),
        "orders": ORDERS,
        "candidates": candidates,
        "replays": {
            name: {
                "settings": settings,
                "races": [
                    _encoded(r, candidates) for r in replay_setting(folder, settings, ORDERS)
                ],
            }
            for name, settings in expected_settings(folder).items()
        },
    }
    path = folder / f"{NAME}.json"
    path.write_text(json.dumps(stored, separators=(",", ":")) + "\n")
    return path


class StaleReplays(ValueError):
    """The stored replays are not of the current artifacts or settings."""


def stored_replays(folder: Path, name: str) -> tuple[dict[str, Any], list[Replayed]]:
    """The grid's record and the stored replays of setting ``name``; :class:`StaleReplays`
    when they were replayed from other inputs or with other settings than today's."""
    stored = load(NAME, folder)
    fix = "run python -m scripts.tables --replay"
    if stored["inputs"] != _inputs_digest(folder):
        raise StaleReplays(
            f"{NAME}.json was replayed from other grid or benchmark files or race code: {fix}"
        )
    expected = expected_settings(folder)[name]
    if stored["replays"][name]["settings"] != expected:
        raise StaleReplays(f"{NAME}.json replayed {name!r} with other settings: {fix}")
    races = [_decoded(row, stored["candidates"]) for row in stored["replays"][name]["races"]]
    return load("race_bench", folder)["grid"], races
