"""One Door enum for every timeline of the site."""

from __future__ import annotations

from marin_site.doors import Door
from proposals.models import Event
from runs.models import RecipeEvent, RunEvent
from runs.services import runs as run_writes


def test_every_timeline_names_its_door_from_the_one_enum() -> None:
    assert run_writes.Door is Door
    for model in (Event, RunEvent, RecipeEvent):
        assert model._meta.get_field("door").choices == Door.choices, model


def test_the_doors_of_the_design_are_all_there() -> None:
    assert {"web", "api", "github", "worker", "runner", "agent", "mlflow", "admin"} <= set(
        Door.values
    )
