"""How a stored metric value is shown: one rule for every table, chart, range, campaign,
result comment and export.

Values are stored as the trainer logged them. A recipe's declaration
(``runs.metrics.declarations``) says how a key is shown (``unit``) and, when the trainer
logs it in the other of fraction and percent, how it is logged (``logged_as``). So

- ``unit: percent`` (Levanter's ``throughput/mfu``, logged as 17.4) is shown ``17.4%``;
- ``unit: percent, logged_as: fraction`` (a trainer logging 0.174) is shown ``17.4%`` too;
- ``unit: fraction`` (``moe/drop_fraction``, logged as 0.023) is shown ``0.023``;
- a key no recipe declares is shown as logged: no unit, no guess from its name.

``MetricDisplay`` is that rule for one key: the text of a value, a range, a spread and a
difference; the column or axis title (``MFU (%)``); and what a chart needs (its title and
tick format, ``chart_meta``), which the charts' script (``static/js/units.js``) formats
exactly as ``text`` does. Every value handed to it is a stored value; it converts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from runs.metrics.declarations import MetricDeclaration, declarations_parse
from runs.models import Recipe

# How each declared unit is written after a value, and in a title: "MFU (%)".
UNIT_SYMBOLS = {
    "percent": "%",
    "fraction": "fraction",
    "tokens/s": "tokens/s",
    "seconds": "s",
    "tokens": "tokens",
    "count": "",
    "flops": "FLOPs",
    "bytes": "bytes",
    "nats": "nats",
    "bits/byte": "bits/byte",
}

# The tick format of a chart's axis for each unit (static/js/units.js): "percent" 20%,
# "fraction" 0.02, "count" 1.2k 3.4M 5B (tokens and steps, as the field writes sizes), "si"
# 3.2G 1Z (FLOPs, bytes, tokens/s: SI prefixes), "seconds" 30 s 5 min 2 h, "number" plain.
TICK_FORMATS = {
    "percent": "percent",
    "fraction": "fraction",
    "tokens/s": "si",
    "seconds": "seconds",
    "tokens": "count",
    "count": "count",
    "flops": "si",
    "bytes": "si",
    "nats": "number",
    "bits/byte": "number",
}

_FACTORS = {("fraction", "percent"): 100.0, ("percent", "fraction"): 0.01}

SI_PREFIXES = ((1e24, "Y"), (1e21, "Z"), (1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"))
SI_SMALL = ((1e6, "M"), (1e3, "k"))
COUNT_PREFIXES = ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k"))


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def factor_between(logged: str, shown: str) -> float:
    """What a value logged in ``logged`` is multiplied by to be in ``shown`` (1 when the
    units are the same or not convertible)."""
    return _FACTORS.get((logged, shown), 1.0)


def _significant(value: float, digits: int) -> str:
    """``value`` to ``digits`` significant digits (plain notation down to 0.0001)."""
    return f"{value:.{digits}g}"


def prefixed(value: float, prefixes: Iterable[tuple[float, str]] = SI_PREFIXES + SI_SMALL) -> str:
    """A large value with a prefix and 3 significant digits: 3.2G, 100E, 1.5k; small ones
    plain."""
    size = abs(value)
    for scale, prefix in prefixes:
        if size >= scale:
            return f"{_significant(value / scale, 3)}{prefix}"
    return _significant(value, 3) if size else "0"


def duration_text(seconds: float) -> str:
    """A duration as people say it: 12.3 s, 5 min 20 s, 3 h 5 min, 2 d 4 h."""
    size = abs(seconds)
    sign = "−" if seconds < 0 else ""
    if size < 60:
        return f"{sign}{size:.1f} s"
    minutes = int(size // 60)
    if minutes < 60:
        return f"{sign}{minutes} min {int(size % 60)} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{sign}{hours} h {minutes} min"
    days, hours = divmod(hours, 24)
    return f"{sign}{days} d {hours} h"


def number_text(value: float, unit: str = "") -> str:
    """A value already in the unit it is shown in, written for a table: percents to a tenth
    with a percent sign, fractions to three places, tokens/s and counts whole, seconds to a
    tenth, FLOPs as 3.2e+18, anything else to four places (4 significant digits above 1000)."""
    if unit == "percent":
        if value == 0 or abs(value) >= 0.1:
            return f"{value:.1f}%"
        return f"{_significant(value, 2)}%"
    if unit == "fraction":
        if value == 0 or abs(value) >= 0.01:
            return f"{value:.3f}"
        return _significant(value, 2)
    if unit == "tokens/s":
        return f"{value:,.0f}" if abs(value) >= 100 else _significant(value, 3)
    if unit == "seconds":
        return f"{value:,.1f} s"
    if unit in {"tokens", "count", "bytes"}:
        return f"{value:,.0f}" if abs(value) < 1e12 else f"{value:.3g}"
    if unit == "flops":
        return f"{value:.3g}"
    return f"{value:.4f}" if abs(value) < 1000 else f"{value:.4g}"


@dataclass(frozen=True, slots=True)
class MetricDisplay:
    """How one key is shown: its label, the unit it is shown in and the factor from the
    unit it is stored in."""

    key: str
    label: str  # the declared display name; the key when there is none
    unit: str = ""  # the unit it is shown in ("" when not declared)
    factor: float = 1.0  # stored value x factor = shown value
    direction: str = ""

    @classmethod
    def of(cls, key: str, declaration: MetricDeclaration | None = None) -> MetricDisplay:
        if declaration is None:
            return cls(key=key, label=key)
        return cls(
            key=key,
            label=declaration.display or key,
            unit=declaration.unit,
            factor=factor_between(declaration.logged_as or declaration.unit, declaration.unit),
            direction=declaration.direction,
        )

    @property
    def symbol(self) -> str:
        return UNIT_SYMBOLS.get(self.unit, self.unit)

    @property
    def title(self) -> str:
        """The heading of a column or the title of an axis: ``MFU (%)``, ``Train loss (nats)``."""
        return f"{self.label} ({self.symbol})" if self.symbol else self.label

    @property
    def tick_format(self) -> str:
        return TICK_FORMATS.get(self.unit, "number")

    @property
    def better(self) -> str:
        """Which way is better, in words; nothing when not declared."""
        return {"lower": "lower is better", "higher": "higher is better"}.get(self.direction, "")

    def shown(self, stored: Any) -> float | None:
        """A stored value in the unit it is shown in; None when it is not a number."""
        return float(stored) * self.factor if is_number(stored) else None

    def text(self, stored: Any) -> str:
        """A stored value as the pages write it: ``17.4%``, ``0.023``, ``3.1490``; a dash
        when there is none."""
        value = self.shown(stored)
        return "–" if value is None else number_text(value, self.unit)

    def range_text(self, low: Any, high: Any) -> str:
        """Two stored values as a range, joined by an en dash: ``21.0%`` to ``27.0%``."""
        return f"{self.text(low)}–{self.text(high)}"

    def spread_text(self, mean: Any, std: Any) -> str:
        """A mean over seeds ± its sample standard deviation: ``3.0100 ± 0.0141``,
        ``3.0100 (1 seed)`` when no spread is known."""
        if not is_number(mean):
            return "–"
        if not is_number(std):
            return f"{self.text(mean)} (1 seed)"
        return f"{self.text(mean)} ± {self.text(std)}"

    def delta_text(self, delta: Any, se: Any = None) -> str:
        """A difference with a true minus sign (U+2212), ± its standard error when known."""
        if not is_number(delta):
            return "–"
        sign = "+" if delta > 0 else "−" if delta < 0 else "±"
        text = f"{sign}{self.text(abs(delta))}"
        if is_number(se):
            text += f" ± {self.text(se)}"
        return text

    def chart_meta(self) -> dict[str, str]:
        """What a chart of the key needs: its caption, axis title, unit and tick format."""
        return {
            "label": self.label,
            "title": self.title,
            "unit": self.unit,
            "format": self.tick_format,
        }


def displays(
    keys: Iterable[str], declarations: Mapping[str, MetricDeclaration]
) -> dict[str, MetricDisplay]:
    return {key: MetricDisplay.of(key, declarations.get(key)) for key in keys}


def recipe_declarations(
    pairs: Iterable[tuple[str, str]],
) -> dict[tuple[str, str], dict[str, MetricDeclaration]]:
    """The metric declarations of each (recipe name, version), in one query."""
    wanted = set(pairs)
    if not wanted:
        return {}
    names = {name for name, _ in wanted}
    found: dict[tuple[str, str], dict[str, MetricDeclaration]] = {pair: {} for pair in wanted}
    for name, version, metrics in Recipe.objects.filter(name__in=names).values_list(
        "name", "version", "metrics"
    ):
        if (name, version) in wanted:
            found[(name, version)] = declarations_parse(metrics)
    return found


@dataclass(frozen=True, slots=True)
class SharedDisplay:
    """One key shown across runs of several recipes (the compare page, a campaign): the
    display of the first recipe that declares it, and for each recipe the factor taking its
    stored values into that display's unit."""

    display: MetricDisplay
    factors: dict[tuple[str, str], float]

    def factor(self, recipe: tuple[str, str]) -> float:
        return self.factors.get(recipe, 1.0)


def shared_displays(
    keys: Iterable[str],
    declarations: Mapping[tuple[str, str], Mapping[str, MetricDeclaration]],
    order: Iterable[tuple[str, str]],
) -> dict[str, SharedDisplay]:
    """Each key's display across recipes, the first recipe in ``order`` that declares the
    key deciding; the others' values are converted into its unit (fraction and percent)."""
    ordered = list(dict.fromkeys(order))
    out: dict[str, SharedDisplay] = {}
    for key in keys:
        chosen = next(
            (declarations[r][key] for r in ordered if key in declarations.get(r, {})), None
        )
        display = MetricDisplay.of(key, chosen)
        factors: dict[tuple[str, str], float] = {}
        for recipe in ordered:
            declared = declarations.get(recipe, {}).get(key)
            if declared is None or chosen is None:
                factors[recipe] = 1.0
                continue
            factors[recipe] = factor_between(
                declared.logged_as or declared.unit, chosen.unit or declared.unit
            )
        out[key] = SharedDisplay(display=display, factors=factors)
    return out
