"""The race's answer, on the sweep's parent run: one sentence (printed too), ``advice.md``, a
self-contained ``advice.html`` with the race chart, ``race.json`` (every value and decision),
tags ``advice/advised`` (the candidate to use), ``advice/winner`` (the survivor, or the
survivors best first, comma-separated, when the race stopped before one remained) and
``advice/eliminated`` (in the order they went out), and metrics ``advice/certificate`` (in
points: no candidate is more than that better than the advised one, at confidence 1 - alpha),
``advice/runs_used``, ``advice/epochs`` (the epochs of training behind the values the race
used), ``advice/rounds``, ``advice/seeds``.

Then, once, the test set: the survivors' ``final/`` metrics from their child runs beside their
validation figures. The race never reads them; they confirm, they select nothing.

Differences are to the round's leader in points (100 x the objective), with the race's interval:
difference +- d * SE at that round's level (:mod:`experiments.race.rule`), which lies below 0
exactly when the candidate was eliminated.
"""

from __future__ import annotations

import base64
import html
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from experiments.race.chart import chart
from experiments.race.race import MAX_RUNS, MAX_SEEDS, Race
from experiments.stats import Interval, t_interval

CONFIRM = ("accuracy", "macro_f1", "few_accuracy")  # test metrics shown beside the objective's


def points(value: float) -> str:
    return f"{100 * value:+.1f}"


def interval(race: Race, candidate: str) -> tuple[float, float, float]:
    """(difference, low, high) to the leader at the look that decided about ``candidate``."""
    look = race.round_of(candidate)
    diff = look.difference[candidate]
    return diff, diff - look.margin, diff + look.margin


def _diff_text(race: Race, candidate: str) -> str:
    diff, low, high = interval(race, candidate)
    return f"{points(diff)} points [{points(low)}, {points(high)}]"


def eliminated_order(race: Race) -> list[str]:
    """Eliminated candidates by round; within a round the failed first, then the furthest
    behind."""
    return sorted(
        race.eliminated_in,
        key=lambda c: (race.eliminated_in[c], race.round_of(c).difference.get(c, -math.inf), c),
    )


def _out_text(race: Race, candidate: str) -> str:
    """Why ``candidate`` is out: "out in round 1: diverged at epoch 2 on seeds 0, 1, 2", or
    "out in round 1 (-14.9 points [-18.0, -11.8])"."""
    failure = race.failure(candidate)
    where = f"out in round {race.eliminated_in[candidate]}"
    return f"{where}: {failure}" if failure else f"{where} ({_diff_text(race, candidate)})"


def guarantee(race: Race) -> str:
    """The certificate in words: "no candidate is more than 1.2 points better (95%), within
    delta=2 points" (or "not within delta=2 points: max_seeds reached")."""
    confidence = f"{100 * (1 - race.alpha):g}%"
    head = f"no candidate is more than {100 * race.certificate:.1f} points better ({confidence})"
    if race.certificate <= race.settings.tolerance:
        return f"{head}, within delta={race.delta:g} points"
    why = {MAX_RUNS: "max_runs", MAX_SEEDS: "max_seeds"}.get(race.stop_reason or "", "the budget")
    return f"{head}: not within delta={race.delta:g} points ({why} reached)"


def sentence(race: Race, objective: str) -> str:
    """The answer in one sentence, e.g. "use weighted: no candidate is more than 1.2 points
    better (95%), within delta=2 points; weighted leads on val/balanced_accuracy after 5 rounds
    (31 runs, 7 seeds); uniform out in round 1 (-14.9 points [-18.0, -11.8]); hybrid not
    separable from weighted (-0.2 points [-1.0, +0.6])"."""
    survivors, advised = race.survivors, race.advised
    leader = survivors[0]
    rounds = len(race.rounds)
    spent = f"after {rounds} round{'s' * (rounds != 1)} ({race.runs} runs, {race.seeds_used} seeds)"
    if len(survivors) == 1:
        how = f"best on {objective} {spent}"
    else:
        how = f"{leader} leads on {objective} {spent}"
        if advised != leader:
            behind = race.rounds[-1].difference[advised]
            how += f"; {advised} is {-100 * behind:.1f} points behind it and preferred"
    parts = [f"use {advised}: {guarantee(race)}; {how}"]
    for candidate in eliminated_order(race):
        parts.append(f"{candidate} {_out_text(race, candidate)}")
    for candidate in survivors[1:]:
        parts.append(f"{candidate} not separable from {leader} ({_diff_text(race, candidate)})")
    return "; ".join(parts)


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


def _cell(i: Interval | None) -> str:
    if i is None:
        return "—"
    return f"{i.mean:.4f}" if math.isnan(i.half_width) else f"{i.mean:.4f} ± {i.half_width:.4f}"


def tables(
    race: Race, objective: str, confirmed: Sequence[Confirmation]
) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) of the rounds, the candidates and the test-set confirmation."""
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
                + [f"{c} ({_diff_text(race, c)})" for c in r.eliminated]
            )
            or "—",
            str(len(r.candidates) - len(r.eliminated)),
            r.advised,
            f"{100 * r.certificate:.1f}",
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
        vs = "—" if c == look.leader else _diff_text(race, c)
        candidates.append([c, runs, f"{look.means[c]:.4f}", vs, verdict])
    metric_names = list(confirmed[0].test) if confirmed else []
    confirmation = [
        [
            c.candidate,
            str(c.seeds),
            _cell(c.validation),
            *(_cell(c.test.get(m)) for m in metric_names),
        ]
        for c in confirmed
    ]
    return [
        (
            "Rounds",
            [
                "round",
                "seeds",
                "level",
                "d",
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


def rule_text(race: Race) -> str:
    levels = ", ".join(f"{a:.4f}" for a in race.levels)
    return (
        f"After each round a candidate is out when the leader's mean exceeds its own by more than "
        f"d x SE: SE from the residual variance of the candidates x seeds table (seed effects "
        f"removed), d the one-sided Dunnett critical value for comparisons with the best (Hsu's "
        f"MCB) at the round's level. alpha={race.alpha} is spent across the {len(race.levels)} "
        f"rounds the race could have (min_seeds={race.min_seeds}, max_seeds={race.max_seeds}, "
        f"max_runs={race.max_runs}), round r getting alpha (1/r) / H_R: {levels}. "
        f"The certificate of the advised candidate a (the leader, or the first of "
        f"prefer={list(race.prefer)} within delta of it) is max(0, max_j mean_j - mean_a + "
        f"d x SE) over the survivors: with probability at least {1 - race.alpha:g} over the whole "
        f"race no candidate is better than a by more than that (Hsu's MCB bound, simultaneous "
        f"over a). The race stops once it is within delta={race.delta:g} points. "
        f"The race stopped: {race.stop_reason}."
    )


def markdown(race: Race, objective: str, confirmed: Sequence[Confirmation]) -> str:
    out = [f"# The race's answer on {objective}\n", sentence(race, objective) + ".\n"]
    for title, header, rows in tables(race, objective, confirmed):
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


def to_html(race: Race, objective: str, confirmed: Sequence[Confirmation], png: bytes) -> str:
    e = html.escape
    body = [
        f"<h1>The race's answer on {e(objective)}</h1>",
        f"<p><b>{e(sentence(race, objective))}.</b></p>",
    ]
    data = base64.b64encode(png).decode()
    body.append(f'<figure><img alt="the race" src="data:image/png;base64,{data}"></figure>')
    for title, header, rows in tables(race, objective, confirmed):
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


def finished_runs(uri: str, parent_run_id: str) -> dict[str, dict[str, float]]:
    """The parent's FINISHED children: config key -> metrics (the newest run per key)."""
    from mlflow.tracking import MlflowClient

    from runner.tracking.runs import child_runs

    client = MlflowClient(tracking_uri=uri)
    parent = client.get_run(parent_run_id)
    found: dict[str, dict[str, float]] = {}
    for run in child_runs(client, parent.info.experiment_id, parent_run_id):  # newest first
        key = run.data.tags.get("config_key")
        if run.info.status == "FINISHED" and key and key not in found:
            found[key] = dict(run.data.metrics)
    return found


def publish(
    race: Race,
    objective: str,
    keys: Mapping[tuple[str, int], str],
    where: tuple[str, str] | None,
    epochs: int,
) -> str:
    """Write the answer onto the parent run ``where`` = (uri, run id) when there is one; returns
    the console text: the sentence and the test-set confirmation. ``epochs``: the epochs of
    training behind the race's values (:func:`experiments.race.driver.epochs_trained`)."""
    confirmed = confirm(race, objective, keys, finished_runs(*where) if where else {})
    text = [f"samplerlab race: {sentence(race, objective)}."]
    metric = f"final/{objective.partition('/')[2]}"
    seen = [c for c in confirmed if metric in c.test]
    if seen:
        text.append(
            "  the test set, once (a confirmation; it selected nothing): "
            + "; ".join(
                f"{c.candidate} {metric} {_cell(c.test[metric])} (validation {_cell(c.validation)})"
                for c in seen
            )
        )
    if where is None:
        text.append("  (no sweep parent run: nothing logged)")
        return "\n".join(text)
    uri, parent = where
    from mlflow.tracking import MlflowClient

    from runner.tracking import log_to_run

    png = chart(race, objective)
    files: dict[str, Any] = {
        "advice.md": markdown(race, objective, confirmed),
        "advice.html": to_html(race, objective, confirmed, png),
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
    client.set_tag(parent, "advice/advised", race.advised)
    client.set_tag(parent, "advice/winner", ",".join(race.survivors))
    client.set_tag(parent, "advice/eliminated", ",".join(eliminated) or "(none)")
    client.set_tag(parent, "advice/objective", objective)
    client.set_tag(parent, "advice/stop", race.stop_reason or "")
    text.append(
        f"  the answer is on the parent run {parent}: advice.md, advice.html (tags advice/*)"
    )
    return "\n".join(text)
