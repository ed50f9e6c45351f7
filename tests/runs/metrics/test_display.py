"""One display rule: a stored value is shown in its key's declared unit, converted from the
unit it is logged in, with the same text in tables, ranges, spreads and differences; an
undeclared key as logged."""

from __future__ import annotations

import pytest

from runs.metrics.declarations import MetricDeclaration
from runs.metrics.display import (
    MetricDisplay,
    duration_text,
    factor_between,
    number_text,
    prefixed,
    shared_displays,
)

MFU = MetricDeclaration(key="throughput/mfu", unit="percent", display="MFU", direction="higher")
MFU_AS_FRACTION = MetricDeclaration(
    key="throughput/mfu", unit="percent", logged_as="fraction", display="MFU"
)
DROP = MetricDeclaration(key="moe/drop_fraction", unit="fraction", display="Dropped tokens")


def test_a_percent_logged_in_percent_is_shown_as_logged() -> None:
    shown = MetricDisplay.of(MFU.key, MFU)
    assert shown.text(22.87) == "22.9%"
    assert shown.title == "MFU (%)"
    assert shown.chart_meta() == {
        "label": "MFU",
        "title": "MFU (%)",
        "unit": "percent",
        "format": "percent",
    }


def test_a_percent_logged_as_a_fraction_is_converted_when_shown() -> None:
    shown = MetricDisplay.of(MFU_AS_FRACTION.key, MFU_AS_FRACTION)
    assert shown.factor == 100.0
    assert shown.text(0.2287) == "22.9%"
    assert shown.range_text(0.2058, 0.2148) == "20.6%–21.5%"
    assert shown.spread_text(0.25, 0.01) == "25.0% ± 1.0%"
    assert shown.delta_text(-0.02, 0.005) == "−2.0% ± 0.5%"


def test_levanters_mfu_never_shows_as_thousands_of_percent() -> None:
    """The bug of the old declaration (logged_as: fraction on Levanter's percent): the fixed
    recipe shows what Levanter logs."""
    from runs.metrics.declarations import declarations_parse
    from runs.recipes.demo import MARIN_MOE, TINY_MOE

    for recipe in (MARIN_MOE, TINY_MOE):
        declared = declarations_parse(recipe["metrics"])
        assert declared["throughput/mfu"].unit == "percent"
        assert not declared["throughput/mfu"].logged_as
        shown = MetricDisplay.of("throughput/mfu", declared["throughput/mfu"])
        assert shown.text(22.87) == "22.9%"
        assert shown.range_text(20.583, 21.48) == "20.6%–21.5%"
        drop = MetricDisplay.of("moe/drop_fraction", declared["moe/drop_fraction"])
        assert drop.text(0.0234) == "0.023"
        assert drop.range_text(0.023, 0.024) == "0.023–0.024"


def test_a_fraction_is_shown_as_a_fraction_everywhere() -> None:
    shown = MetricDisplay.of(DROP.key, DROP)
    assert shown.text(0.078) == "0.078"
    assert shown.text(0.0021) == "0.0021"
    assert shown.title == "Dropped tokens (fraction)"
    assert shown.tick_format == "fraction"


def test_an_undeclared_key_is_shown_as_logged_whatever_its_name() -> None:
    shown = MetricDisplay.of("throughput/mfu")
    assert shown.text(0.25) == "0.2500"
    assert shown.text(25.0) == "25.0000"
    assert shown.title == "throughput/mfu"
    assert shown.tick_format == "number"
    assert shown.text(None) == "–"
    assert shown.text(float("nan")) == "–"


@pytest.mark.parametrize(
    ("value", "unit", "text"),
    [
        (17.4, "percent", "17.4%"),
        (0.02, "percent", "0.02%"),
        (0.0, "fraction", "0.000"),
        (460681.2, "tokens/s", "460,681"),
        (12.34, "seconds", "12.3 s"),
        (3.2e18, "flops", "3.2e+18"),
        (16_777_216, "tokens", "16,777,216"),
        (3.1490, "nats", "3.1490"),
        (123456.0, "", "1.235e+05"),
    ],
)
def test_each_unit_is_written_one_way(value: float, unit: str, text: str) -> None:
    assert number_text(value, unit) == text


@pytest.mark.parametrize(
    ("value", "text"),
    [(1e20, "100E"), (1e21, "1Z"), (6.7e11, "670G"), (460_681, "461k"), (12, "12"), (0, "0")],
)
def test_large_values_take_si_prefixes_never_a_raw_number_and_a_prefix(
    value: float, text: str
) -> None:
    assert prefixed(value) == text


def test_durations_are_written_as_people_say_them() -> None:
    assert duration_text(12.34) == "12.3 s"
    assert duration_text(320) == "5 min 20 s"
    assert duration_text(3 * 3600 + 300) == "3 h 5 min"
    assert duration_text(2 * 86400 + 4 * 3600) == "2 d 4 h"


def test_fraction_and_percent_convert_into_each_other_only() -> None:
    assert factor_between("fraction", "percent") == 100.0
    assert factor_between("percent", "fraction") == 0.01
    assert factor_between("percent", "percent") == 1.0
    assert factor_between("tokens/s", "percent") == 1.0


def test_across_recipes_the_first_declaring_recipe_decides_and_others_convert() -> None:
    levanter = ("marin-moe", "1")
    other = ("fraction-trainer", "1")
    declarations = {levanter: {"throughput/mfu": MFU}, other: {"throughput/mfu": MFU_AS_FRACTION}}
    shared = shared_displays(["throughput/mfu", "x"], declarations, [levanter, other])
    mfu = shared["throughput/mfu"]
    assert mfu.display.unit == "percent"
    assert mfu.factor(levanter) == 1.0
    assert mfu.factor(other) == 100.0
    assert shared["x"].display.title == "x"
    assert shared["x"].factor(other) == 1.0
