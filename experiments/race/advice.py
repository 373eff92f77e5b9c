"""The race's answer, on the sweep's parent run: one sentence (printed too), ``advice.md``, a
self-contained ``advice.html`` with the race chart, ``race.json`` (every value and decision),
tags ``advice/advised`` (the candidate to use), ``advice/winner`` (the survivor, or the
survivors best first, comma-separated, when the race stopped before one remained) and
``advice/eliminated`` (in the order they went out), and metrics ``advice/certificate`` (in
points: no candidate is more than that better than the advised one, at confidence 1 - alpha),
``advice/runs_used``, ``advice/epochs`` (the epochs of training behind the values the race
used), ``advice/rounds``, ``advice/seeds``.

Before it names a candidate the answer asks whether any learned at all
(:mod:`experiments.race.chance`): when none is shown to beat chance by more than ``delta``, the
sentence and ``advice.md`` say "no candidate learned: check the data or the backbone" and why,
the tags ``advice/advised`` and ``advice/winner`` say ``(none: no candidate learned)``, tag
``advice/learned`` is ``false`` (``true``; ``unchecked`` when the objective has no known chance
level) and no model is logged.

The words are :mod:`experiments.race.sentence`'s; intervals in the tables are clipped to what
the objective can be ([0, 1]).

Then, once, the test set: the survivors' ``final/`` metrics from their child runs beside their
validation figures. The race never reads them; they confirm, they select nothing.
"""

from __future__ import annotations

import base64
import html
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from experiments.race.chance import Chance, Learning, chance_level, learning
from experiments.race.chart import chart
from experiments.race.race import Race
from experiments.race.sentence import (
    NO_WINNER,
    agreeing,
    diff_text,
    eliminated_order,
    no_winner,
    sentence,
)
from experiments.race.sentence import interval as interval  # re-exported: the race's intervals
from experiments.stats import Interval, interval_cell, t_interval

CONFIRM = ("accuracy", "macro_f1", "few_accuracy")  # test metrics shown beside the objective's


@dataclass(frozen=True)
class Confirmation:
    """A survivor's validation objective and test metrics over the seeds it ran."""

    candidate: str
    seeds: int
    validation: Interval
    test: dict[str, Interval]


def confirm(
    race: Race,
    objective: str,
    keys: Mapping[tuple[str, int], str],
    runs: Mapping[str, Mapping[str, float]],
) -> list[Confirmation]:
    """The survivors' figures: ``keys`` maps (candidate, seed) to the job's config key,
    ``runs`` a config key to its FINISHED child run's metrics."""
    metric = objective.partition("/")[2]
    shown = (metric, *(m for m in CONFIRM if m != metric))
    out = []
    for candidate in race.survivors:
        seeds = [s for s in race.seeds if s in race.values[candidate]]
        found = [runs.get(keys.get((candidate, s), ""), {}) for s in seeds]
        test = {}
        for name in shown:
            values = [m[f"final/{name}"] for m in found if f"final/{name}" in m]
            if values:
                test[f"final/{name}"] = t_interval(values)
        validation = t_interval([race.values[candidate][s] for s in seeds])
        out.append(Confirmation(candidate, len(seeds), validation, test))
    return out


def tables(
    race: Race,
    objective: str,
    confirmed: Sequence[Confirmation],
    learned: Learning | None = None,
) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) of the rounds, the candidates, the test against chance (when
    ``learned`` ran) and the test-set confirmation."""
    rounds = [
        [
            str(r.number),
            str(len(r.seeds)),
            f"{r.level:.4f}",
            f"{r.critical:.2f}",
            r.leader,
            f"{r.means[r.leader]:.4f}",
            ", ".join(
                [f"{c} (failed: {why})" for c, why in r.failed.items()]
                + [f"{c} ({diff_text(race, c)})" for c in r.eliminated]
            )
            or "—",
            str(len(r.candidates) - len(r.eliminated)),
            r.advised,
            agreeing(100 * r.certificate, race.delta, r.certificate <= race.settings.tolerance),
            str(r.runs),
        ]
        for r in race.rounds
    ]
    best = race.survivors[0]
    out_last_first = sorted(
        race.eliminated_in,
        key=lambda c: (-race.eliminated_in[c], -race.round_of(c).means.get(c, -math.inf)),
    )
    candidates = []
    for c in [*race.survivors, *out_last_first]:
        look = race.round_of(c)
        runs = str(len(race.values[c]) + len(race.failed.get(c, {})))
        if c in race.eliminated_in:
            failure = race.failure(c)  # an interval has its own column
            verdict = f"out in round {race.eliminated_in[c]}" + (f": {failure}" if failure else "")
        elif no_winner(learned):
            verdict = "leader, not advised: no candidate learned" if c == best else "survivor"
        elif c == best:
            verdict = "winner" if len(race.survivors) == 1 else "leader (survivor)"
            verdict += ", advised" if c == race.advised else ""
        elif c == race.advised:
            verdict = "survivor, advised (preferred, within delta)"
        else:
            verdict = "survivor: not separable"
        if c not in look.means:  # out failing: no mean, nothing to compare
            candidates.append([c, runs, "—", "—", verdict])
            continue
        vs = "—" if c == look.leader else diff_text(race, c)
        candidates.append([c, runs, f"{look.means[c]:.4f}", vs, verdict])
    metric_names = list(confirmed[0].test) if confirmed else []
    confirmation = [
        [
            c.candidate,
            str(c.seeds),
            interval_cell(c.validation),
            *(interval_cell(c.test.get(m)) for m in metric_names),
        ]
        for c in confirmed
    ]
    against = [] if learned is None else _against_chance(learned)
    return [
        *against,
        (
            "Rounds",
            [
                "round",
                "seeds",
                "level",
                "t",
                "leader",
                "leader's mean",
                "eliminated (vs leader)",
                "left",
                "advised",
                "certificate (points)",
                "runs",
            ],
            rounds,
        ),
        (
            "Candidates",
            ["candidate", "runs", f"mean {objective}", "vs leader", "verdict"],
            candidates,
        ),
        (
            "The test set, once (a confirmation: it selected nothing)",
            ["survivor", "seeds", objective, *metric_names],
            confirmation,
        ),
    ]


def _against_chance(learned: Learning) -> list[tuple[str, list[str], list[list[str]]]]:
    """The test against chance as a table (none when it did not run)."""
    if learned.learned is None or learned.chance.level is None:
        return []
    above = learned.chance.level + learned.delta / 100
    rows = [
        [
            c,
            f"{learned.means[c]:.4f}",
            f"{bound:.4f}",
            "yes" if bound > above else "no",
        ]
        for c, bound in sorted(learned.bounds.items(), key=lambda cb: -learned.means[cb[0]])
    ]
    title = (
        f"Against chance ({learned.chance.level:.4f}, {learned.chance.source}; "
        f"one-sided {100 * learned.confidence:g}% over {len(rows)} candidates)"
    )
    header = ["candidate", "mean", "lower bound", f"above chance + delta ({above:.4f})?"]
    return [(title, header, rows)]


def rule_text(race: Race) -> str:
    levels = ", ".join(f"{a:.4f}" for a in race.levels)
    return (
        f"After each round a candidate k is out when the leader L's mean exceeds its own by "
        f"more than t x SE_Lk: SE_Lk the standard error of the pair's per-seed differences, "
        f"t the one-sided Student t quantile at the round's level over the m - 1 comparisons "
        f"with the leader (Hsu's multiple comparisons with the best, Bonferroni over them). "
        f"alpha={race.alpha} is spent across the {len(race.levels)} "
        f"rounds the race could have (min_seeds={race.min_seeds}, max_seeds={race.max_seeds}, "
        f"max_runs={race.max_runs}), round r getting alpha (1/r) / H_R: {levels}. "
        f"The certificate of the advised candidate a (the leader, or the first of "
        f"prefer={list(race.prefer)} within delta of it) is max(0, max_j (mean_j - mean_a + "
        f"t x SE_ja)) over the survivors: with probability at least {1 - race.alpha:g} over the "
        f"whole race no candidate is better than a by more than that (simultaneous over a). "
        f"The race stops once it is within delta={race.delta:g} points. "
        f"The race stopped: {race.stop_reason}."
    )


def _chance_note(learned: Learning | None) -> str:
    """What the answer says about chance when it could not test against it ("" when it did)."""
    if learned is None or learned.learned is not None:
        return ""
    return f"Not tested against chance: {learned.chance.source}."


def markdown(
    race: Race,
    objective: str,
    confirmed: Sequence[Confirmation],
    learned: Learning | None = None,
) -> str:
    out = [f"# The race's answer on {objective}\n", sentence(race, objective, learned) + ".\n"]
    if note := _chance_note(learned):
        out.append(note + "\n")
    for title, header, rows in tables(race, objective, confirmed, learned):
        out.append(f"## {title}\n")
        out.append("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
        out.extend("| " + " | ".join(row) + " |" for row in rows)
        out.append("")
    out.append(
        "Test metrics are the survivors' final-epoch test figures (mean ± 95% Student-t "
        "half-width over their seeds); the race read only the validation objective.\n"
    )
    out.append("## How the race decides\n")
    out.append(rule_text(race) + "\n")
    out.append("![the race](race_chart.png)\n")
    return "\n".join(out)


def to_html(
    race: Race,
    objective: str,
    confirmed: Sequence[Confirmation],
    png: bytes,
    learned: Learning | None = None,
) -> str:
    e = html.escape
    body = [
        f"<h1>The race's answer on {e(objective)}</h1>",
        f"<p><b>{e(sentence(race, objective, learned))}.</b></p>",
    ]
    if note := _chance_note(learned):
        body.append(f"<p>{e(note)}</p>")
    data = base64.b64encode(png).decode()
    body.append(f'<figure><img alt="the race" src="data:image/png;base64,{data}"></figure>')
    for title, header, rows in tables(race, objective, confirmed, learned):
        body.append(
            f"<h2>{e(title)}</h2><table><tr>"
            + "".join(f"<th>{e(h)}</th>" for h in header)
            + "</tr>"
        )
        body.extend("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in rows)
        body.append("</table>")
    body.append(f"<h2>How the race decides</h2><p>{e(rule_text(race))}</p>")
    style = (
        "body{font-family:system-ui,sans-serif;margin:1.5em;max-width:1200px;color:#222}"
        "table{border-collapse:collapse;margin:0.8em 0;font-size:0.9em}"
        "th,td{border:1px solid #ccc;padding:3px 8px;text-align:left}th{background:#f3f3f3}"
        "img{max-width:100%}"
    )
    return (
        f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>race: {e(objective)}</title>'
        f"<style>{style}</style></head><body>" + "\n".join(body) + "</body></html>\n"
    )


def finished_children(uri: str, parent_run_id: str) -> dict[str, Any]:
    """The parent's FINISHED children: config key -> MLflow run (the newest run per key)."""
    from mlflow.tracking import MlflowClient

    from runner.tracking.runs import child_runs

    client = MlflowClient(tracking_uri=uri)
    parent = client.get_run(parent_run_id)
    found: dict[str, Any] = {}
    for run in child_runs(client, parent.info.experiment_id, parent_run_id):  # newest first
        key = run.data.tags.get("config_key")
        if run.info.status == "FINISHED" and key and key not in found:
            found[key] = run
    return found


def finished_runs(uri: str, parent_run_id: str) -> dict[str, dict[str, float]]:
    """The parent's FINISHED children: config key -> metrics (the newest run per key)."""
    return {k: dict(r.data.metrics) for k, r in finished_children(uri, parent_run_id).items()}


def chance_of(objective: str, children: Mapping[str, Any]) -> Chance:
    """Chance for ``objective`` from the race's children (config key -> MLflow run): the first
    whose metrics and params give one (the candidates share their data)."""
    found = Chance(None, "no finished child run to read the classes from")
    for run in children.values():
        found = chance_level(objective, run.data.metrics, run.data.params)
        if found.level is not None:
            break
    return found


def publish(
    race: Race,
    objective: str,
    keys: Mapping[tuple[str, int], str],
    where: tuple[str, str] | None,
    epochs: int,
) -> tuple[str, str | None]:
    """Write the answer onto the parent run ``where`` = (uri, run id) when there is one; returns
    the console text (the sentence and the test-set confirmation) and the advised candidate
    (None when no candidate learned). ``epochs``: the epochs of training behind the race's
    values (:func:`experiments.race.driver.epochs_trained`)."""
    children = finished_children(*where) if where else {}
    runs = {k: dict(r.data.metrics) for k, r in children.items()}
    confirmed = confirm(race, objective, keys, runs)
    learned = learning(race, chance_of(objective, children))
    advised = None if no_winner(learned) else race.advised
    text = [f"samplerlab race: {sentence(race, objective, learned)}."]
    metric = f"final/{objective.partition('/')[2]}"
    seen = [c for c in confirmed if metric in c.test]
    if seen:
        text.append(
            "  the test set, once (a confirmation; it selected nothing): "
            + "; ".join(
                f"{c.candidate} {metric} {interval_cell(c.test[metric])} (validation {interval_cell(c.validation)})"
                for c in seen
            )
        )
    if where is None:
        text.append("  (no sweep parent run: nothing logged)")
        return "\n".join(text), advised
    uri, parent = where
    from mlflow.tracking import MlflowClient

    from runner.tracking import log_to_run

    png = chart(race, objective)
    files: dict[str, Any] = {
        "advice.md": markdown(race, objective, confirmed, learned),
        "advice.html": to_html(race, objective, confirmed, png, learned),
        "race_chart.png": png,
        "race.json": json.dumps({"objective": objective, **race.to_dict()}, indent=1) + "\n",
    }
    metrics = {
        "advice/certificate": 100 * race.certificate,
        "advice/runs_used": race.runs,
        "advice/epochs": epochs,
        "advice/rounds": len(race.rounds),
        "advice/seeds": race.seeds_used,
    }
    log_to_run(uri, parent, metrics, files)
    client = MlflowClient(tracking_uri=uri)
    eliminated = eliminated_order(race)
    client.set_tag(parent, "advice/advised", advised or NO_WINNER)
    client.set_tag(parent, "advice/winner", ",".join(race.survivors) if advised else NO_WINNER)
    said = {True: "true", False: "false", None: "unchecked"}[learned.learned]
    client.set_tag(parent, "advice/learned", said)
    client.set_tag(parent, "advice/eliminated", ",".join(eliminated) or "(none)")
    client.set_tag(parent, "advice/objective", objective)
    client.set_tag(parent, "advice/stop", race.stop_reason or "")
    text.append(
        f"  the answer is on the parent run {parent}: advice.md, advice.html (tags advice/*)"
    )
    return "\n".join(text), advised
