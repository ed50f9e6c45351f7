"""Marin's speedrun results imported as runs (runs/imports/speedrun.py), from files in
Marin's own formats (tests/fixtures/speedrun/)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from marin_site import importing
from runs.imports import speedrun
from runs.models import Plan, Run, RunOrigin, RunState

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "speedrun"
RESULTS_130M = FIXTURES / "experiments/speedrun/adamw_llama_scaling/130m/speedrun_results.json"
RESULTS_SWEEP = FIXTURES / "experiments/speedrun/muon_sweep/speedrun_results.json"
BOARD = FIXTURES / "runs.json"

pytestmark = pytest.mark.sqlite  # JSON lookups of plans by track, on both databases


def _import(path: Path, **kwargs: Any) -> importing.ImportReport:
    return importing.import_run(kind="speedrun", source=str(path), **kwargs)


@pytest.mark.django_db
def test_results_file_becomes_a_finished_imported_run_with_marin_figures() -> None:
    report = _import(RESULTS_130M)
    assert (report.matched_count, report.refused_count) == (1, 0)
    run = Run.objects.get()
    assert run.origin == RunOrigin.IMPORTED and run.state == RunState.FINISHED
    assert run.imported_from == "wandb:example-org/speedrun/llama_130m_adamw_4096-ab2740"
    assert run.final_metrics == pytest.approx(
        {
            "eval/paloma/c4_en/bpb": 1.1862303018569946,
            "model_flops": 1.777337490915459e18,
            "training_hardware_flops": 1.65297833431566e19,
            "training_time": 1125.3937461299429,
            "model_size": 154147328.0,
            "total_tokens": 2599944192.0,
        }
    )
    assert run.tracker_tags["author"] == "Ada Example"
    assert run.tracker_tags["author.affiliation"] == "Example University"
    assert run.tracker_tags["speedrun.name"] == "adamw_llama_scaling/130m"
    assert run.tracker_tags["speedrun.track"] == "130m"
    assert run.wandb_url.endswith("/runs/llama_130m_adamw_4096-ab2740")
    assert (
        run.finished_at is not None and run.finished_at.isoformat() == "2025-06-27T06:41:56+00:00"
    )
    assert run.started_at is not None
    assert round((run.finished_at - run.started_at).total_seconds()) == 1125
    assert run.config["model_config"]["hidden_dim"] == 512
    assert run.resources == {"device_flops_override": None, "slice_count": 1, "tpu_type": "v5p-32"}
    assert run.plan.spec == {"speedrun_track": "130m"}
    assert run.plan.recipe.name == "marin-speedrun" and not run.plan.recipe.is_active
    assert run.events.get().message.startswith("imported from Marin's speedrun results")
    assert f"run {run.pk} created: track 130m, eval/paloma/c4_en/bpb 1.186" in report.as_text()


@pytest.mark.django_db
def test_importing_twice_changes_nothing() -> None:
    _import(RESULTS_130M)
    again = _import(RESULTS_130M)
    assert Run.objects.count() == 1
    assert again.matched_count == 0 and again.skipped_count == 1
    assert "already imported as run" in again.lines[0].reason


@pytest.mark.django_db
def test_changed_figures_update_the_run(tmp_path: Path) -> None:
    _import(RESULTS_130M)
    data = json.loads(RESULTS_130M.read_text())
    data["runs"][0]["run_info"]["eval/paloma/c4_en/bpb"] = 1.18
    changed = tmp_path / "experiments/speedrun/adamw_llama_scaling/130m/speedrun_results.json"
    changed.parent.mkdir(parents=True)
    changed.write_text(json.dumps(data))
    report = _import(changed)
    assert "updated" in report.lines[0].reason
    assert Run.objects.get().final_metrics["eval/paloma/c4_en/bpb"] == 1.18


@pytest.mark.django_db
def test_a_result_without_a_track_or_a_figure_is_refused_and_the_rest_imported() -> None:
    report = _import(RESULTS_SWEEP)
    assert report.matched_count == 0 and report.refused_count == 2
    assert "matches no track" in report.lines[0].reason
    assert (
        report.lines[1].place == "run 2"
        and "'eval/paloma/c4_en/bpb' is missing" in report.lines[1].reason
    )
    with_track = _import(RESULTS_SWEEP, options={"track": "300m"})
    assert with_track.matched_count == 1 and with_track.refused_count == 1
    run = Run.objects.get()
    assert run.plan.spec == {"speedrun_track": "300m"}
    assert run.tracker_tags["speedrun.name"] == "muon_sweep#1"


@pytest.mark.django_db
def test_leaderboard_runs_json_is_read_entry_by_entry() -> None:
    report = _import(BOARD)
    outcomes = [(line.place, line.outcome) for line in report.lines]
    assert outcomes == [
        ("entry 1 (adamw_llama_scaling/130m)", "matched"),
        ("entry 2 (cautious_llama_scaling/1_2b)", "matched"),
        ("entry 3 (hello_world_gpu_speedrun)", "refused"),
        ("entry 4", "refused"),
    ]
    assert "'model_size' is not a number ('520M')" in report.lines[3].reason
    no_link = Run.objects.get(imported_from="speedrun:cautious_llama_scaling/1_2b")
    assert no_link.final_metrics["eval/paloma/c4_en/bpb"] == 0.9011 and no_link.wandb_url == ""
    assert sorted(Plan.objects.values_list("spec__speedrun_track", flat=True)) == ["130m", "1_2b"]


@pytest.mark.django_db
def test_a_result_and_its_leaderboard_entry_are_one_run() -> None:
    _import(RESULTS_130M)
    _import(BOARD)
    assert Run.objects.filter(imported_from__startswith="wandb:").count() == 1


@pytest.mark.django_db
def test_dry_run_reports_and_stores_nothing() -> None:
    report = _import(BOARD, dry_run=True)
    assert report.matched_count == 2 and "would be created" in report.lines[0].reason
    assert not Run.objects.exists() and not Plan.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"{not json", "not JSON"),
        (b'"a string"', "neither a speedrun_results.json nor"),
        (b'{"runs": {"run_info": {}}}', "'runs' must be a list"),
        (b'{"runs": [{"info": {}}]}', "no 'run_info' object"),
        (b'{"runs": [{"run_info": {"eval/paloma/c4_en/bpb": "low"}}]}', "is not a number"),
    ],
)
def test_bad_files_are_refused_in_words(content: bytes, reason: str) -> None:
    upload = io.BytesIO(content)
    report = importing.import_run(kind="speedrun", source=upload, source_name="x.json")
    assert report.refused_count == 1 and reason in report.lines[0].reason
    assert not Run.objects.exists()


@pytest.mark.django_db
def test_bad_track_option_is_refused() -> None:
    report = _import(RESULTS_130M, options={"track": "huge"})
    assert report.refused_count == 1 and "not a size" in report.lines[0].reason


@pytest.mark.django_db
def test_command_imports_and_fails_on_refusals() -> None:
    out = io.StringIO()
    with pytest.raises(CommandError, match="2 refused"):
        call_command("import_history", "speedrun", str(BOARD), stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("entry 1 (adamw_llama_scaling/130m): matched: run ")
    assert lines[-1] == f"speedrun from {BOARD}: imported 2, skipped 0, refused 2."


def test_directory_is_read_from_the_results_path() -> None:
    assert speedrun._directory_of(str(RESULTS_130M)) == "adamw_llama_scaling/130m"
    assert speedrun._directory_of("speedrun_results.json") == ""
    assert speedrun._directory_of("gs://b/x/y/speedrun_results.json") == "x/y"


@pytest.mark.django_db
def test_imported_run_page_shows_its_figures(client: Any) -> None:
    _import(RESULTS_130M)
    run = Run.objects.get()
    page = client.get(f"/runs/{run.pk}/")
    assert page.status_code == 200
    assert b"imported" in page.content and b"1.186" in page.content


@pytest.mark.django_db
def test_two_results_of_one_config_are_two_runs_of_its_entry(tmp_path: Path) -> None:
    _import(RESULTS_130M)
    data = json.loads(RESULTS_130M.read_text())
    data["runs"][0]["run_info"]["wandb_run_link"] = (
        "https://wandb.ai/example-org/speedrun/runs/rerun-1"
    )
    rerun = tmp_path / "experiments/speedrun/adamw_llama_scaling/130m/speedrun_results.json"
    rerun.parent.mkdir(parents=True)
    rerun.write_text(json.dumps(data))
    report = _import(rerun)
    assert report.matched_count == 1
    runs = list(Run.objects.order_by("pk"))
    assert [r.sequence for r in runs] == [0, 1] and runs[0].entry_id == runs[1].entry_id
    assert runs[1].plan.run_count == 1  # one entry, rerun
