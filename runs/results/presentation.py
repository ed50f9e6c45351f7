"""How a run is shown: its label, its grid axes, a config value and its final values, and
the numbers derived from them (spread over seeds, difference from the baseline, a ladder's
exponent, R² and multipliers).

One module, so that the run table, the charts' series (and the PNG drawn from them), the
scaling ladder, the seed table, the compare page, the run page and the result comment say
the same thing the same way. A metric's value is written by ``runs.metrics.display`` (the
one rule for every page: its declared unit and display name; an undeclared key as logged);
the metric functions here are that rule under the names the templates and results use.
A config value is written as in the config's canonical JSON (``runs.specs.ablation.canonical_json``),
so an integral float is an integer: ``capacity_factor=1`` everywhere, never ``=1.0`` in one
place and ``=1`` in another.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from runs.metrics.declarations import MetricDeclaration
from runs.metrics.display import MetricDisplay
from runs.metrics.display import is_number as display_is_number
from runs.metrics.steady import summary_value
from runs.models import MetricSummary, Run
from runs.specs.ablation import canonical_json

BASELINE_LABEL = "baseline"

# A suggested verdict in words, as the outcome it suggests is named (``proposals.models.Outcome``'s
# labels; runs/ cannot import proposals/, a test keeps the two equal).
VERDICT_LABELS = {
    "worked": "Worked",
    "promising": "Promising",
    "mixed": "Mixed",
    "did_not_work": "Did not work",
    "inconclusive": "Inconclusive",
    "not_evaluated": "Not evaluated",
}


def verdict_text(code: Any) -> str:
    """A verdict's words (``Did not work``), never its code; an unknown one as a dash."""
    return VERDICT_LABELS.get(str(code), "–")


def value_text(value: Any) -> str:
    """A config or axis value as a short string: strings bare, anything else as canonical
    JSON (``1.0`` is ``1``, ``0.1`` stays ``0.1``), nothing as a dash."""
    if value is None:
        return "–"
    return value if isinstance(value, str) else canonical_json(value)


def change_parts(changes: Mapping[str, Any]) -> list[str]:
    """``key=value`` for each change against the baseline. ``changes`` maps a parameter to
    its value, or (a plan entry's ``diff``) to ``{"value": ..., "baseline": ...}``."""
    parts = []
    for key, change in changes.items():
        value = change.get("value") if isinstance(change, Mapping) else change
        parts.append(f"{key}={value_text(value)}")
    return parts


def run_label(
    *, changes: Mapping[str, Any], scale: str = "", seed: int | None = None, sequence: int = 0
) -> str:
    """What tells a run from its siblings: its changes against the baseline, its scale and
    seed, and which rerun it is. The run table, the charts and the PNG all show this."""
    parts = change_parts(changes) or [BASELINE_LABEL]
    if scale:
        parts.append(scale)
    if seed is not None:
        parts.append(f"seed {seed}")
    if sequence:
        parts.append(f"rerun {sequence}")
    return " · ".join(parts)


def axis_names(spec: Mapping[str, Any] | None) -> list[str]:
    """A plan's grid axes: its overridden parameters, then scale and seed when it has them."""
    spec = spec or {}
    names = [str(name) for name in (spec.get("axes") or {})]
    if spec.get("scales"):
        names.append("scale")
    if spec.get("seeds"):
        names.append("seed")
    return names


def axis_values(
    names: Sequence[str], *, config: Mapping[str, Any], scale: str, seed: int | None
) -> dict[str, Any]:
    """A run's value on each axis (raw, for sorting, grouping and colouring)."""
    values: dict[str, Any] = {}
    for name in names:
        if name == "scale":
            values[name] = scale
        elif name == "seed":
            values[name] = seed
        else:
            values[name] = config.get(name)
    return values


is_number = display_is_number


def final_values(
    runs: Sequence[Run],
) -> tuple[dict[int, dict[str, float]], dict[int, int], set[str]]:
    """Each run's final value per key (throughput and MFU: the steady-state median,
    ``runs.metrics.steady``), its highest step, and the keys logged as points, in one query. A
    cached run reads the run it reuses; imported tracker summaries fill keys that were never
    streamed."""
    source_of = {run.pk: run.cached_from_id or run.pk for run in runs}
    by_source: dict[int, dict[str, float]] = {}
    steps: dict[int, int] = {}
    for run_id, key, last, step, steady in MetricSummary.objects.filter(
        run_id__in=set(source_of.values())
    ).values_list("run_id", "key", "last", "step", "steady"):
        by_source.setdefault(run_id, {})[key] = summary_value(key=key, last=last, steady=steady)
        steps[run_id] = max(steps.get(run_id, step), step)
    values: dict[int, dict[str, float]] = {}
    progress: dict[int, int] = {}
    for run in runs:
        imported = {k: float(v) for k, v in (run.final_metrics or {}).items() if is_number(v)}
        values[run.pk] = {**imported, **by_source.get(source_of[run.pk], {})}
        if source_of[run.pk] in steps:
            progress[run.pk] = steps[source_of[run.pk]]
    logged = {key for metrics in by_source.values() for key in metrics}
    return values, progress, logged


def metric_label(key: str, declaration: MetricDeclaration | None = None) -> str:
    """A metric's column or row heading: its declared display name and unit, ``MFU (%)``;
    an undeclared key as it is."""
    return MetricDisplay.of(key, declaration).title


def direction_text(declaration: MetricDeclaration | None) -> str:
    """Which way a declared metric is better, in words; nothing when not declared."""
    return MetricDisplay.of("", declaration).better


def metric_text(value: Any, key: str, declaration: MetricDeclaration | None = None) -> str:
    """A stored value of ``key`` as every page writes it (``runs.metrics.display``)."""
    return MetricDisplay.of(key, declaration).text(value)


def spread_text(
    stats: Mapping[str, Any] | None, key: str, declaration: MetricDeclaration | None = None
) -> str:
    """A variant's ``key`` over its seeds (``runs.results.seeds``: mean and sample std):
    ``3.0100 ± 0.0141``, ``3.0100 (1 seed)``."""
    if not isinstance(stats, Mapping):
        return "–"
    return MetricDisplay.of(key, declaration).spread_text(stats.get("mean"), stats.get("std"))


def delta_text(delta: Any, se: Any, key: str, declaration: MetricDeclaration | None = None) -> str:
    """A difference from the baseline with a true minus sign (U+2212), ± its standard error
    when it is known: ``-0.3050 ± 0.0112`` is written with that sign."""
    return MetricDisplay.of(key, declaration).delta_text(delta, se)


def exponent_text(exponent: Any, se: Any = None) -> str:
    """A fitted power law's exponent, signed, ± its standard error when it is known."""
    if not is_number(exponent):
        return "–"
    return f"{exponent:+.3f}" + (f" ± {se:.3f}" if is_number(se) else "")


def r_squared_text(value: Any) -> str:
    return f"{value:.3f}" if is_number(value) else "–"


def multiplier_text(value: Any) -> str:
    """A compute multiplier, throughput ratio or speedup: 1.37 and a times sign."""
    return f"{value:.2f}×" if is_number(value) else "–"


def flops_text(value: Any) -> str:
    """A large count (FLOPs): ``3.2e+18``."""
    return f"{value:.3g}" if is_number(value) else "–"
