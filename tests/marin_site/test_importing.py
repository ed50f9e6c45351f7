"""The import framework: the report, the registry, sources (paths, URLs, caps), the service
with its dry run, and ``manage.py import_history`` (runs/management/commands/)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.core.management.base import CommandError

from marin_site import importing
from tests.factories import RecipeFactory


def _lines_importer(
    source: Any, *, by: Any, dry_run: bool, prefix: str = ""
) -> importing.ImportReport:
    """A tiny importer for these tests: one recipe per line 'name', refusing 'bad' lines
    and skipping blank ones, each line in its own transaction."""
    report = importing.report_start(source, "lines")
    for number, raw in enumerate(source, start=1):
        text = raw.decode().strip()
        if not text:
            report.skipped(f"line {number}", "blank")
            continue
        if text == "bad":
            report.refused(f"line {number}", "the word 'bad' matches nothing")
            continue
        with importing.item_transaction(dry_run=dry_run):
            RecipeFactory(name=f"{prefix}{text}")
        report.matched(f"line {number}", f"recipe {prefix}{text}")
    return report


@pytest.fixture
def lines_importer(monkeypatch: pytest.MonkeyPatch) -> importing.Importer:
    monkeypatch.setattr(importing, "_REGISTRY", dict(importing._REGISTRY))
    return importing.register_importer(
        "lines",
        "Lines of names",
        _lines_importer,
        description="One recipe per line.",
        options=(importing.ImportOption("prefix", "Name prefix", help="put before each name"),),
        accepts_url=True,
    )


def _recipes() -> list[str]:
    from runs.models import Recipe

    return sorted(Recipe.objects.values_list("name", flat=True))


def test_report_counts_and_renders_each_place() -> None:
    report = importing.ImportReport(kind="k", source="f.json")
    report.matched("line 1")
    report.skipped("line 2", "blank")
    report.refused("line 3", "matches no track")
    assert (report.matched_count, report.skipped_count, report.refused_count) == (1, 1, 1)
    assert report.as_text().splitlines() == [
        "line 1: matched",
        "line 2: skipped: blank",
        "line 3: refused: matches no track",
        "k from f.json: imported 1, skipped 1, refused 1.",
    ]
    assert report.as_dict()["counts"] == {"matched": 1, "skipped": 1, "refused": 1}


def test_report_keeps_counting_past_the_places_it_lists() -> None:
    report = importing.ImportReport()
    for i in range(importing.MAX_REPORTED_PLACES + 5):
        report.matched(f"line {i}")
    assert report.matched_count == importing.MAX_REPORTED_PLACES + 5
    assert len(report.lines) == importing.MAX_REPORTED_PLACES
    assert "... and 5 more places not listed" in report.as_text()


@pytest.mark.django_db
def test_import_run_imports_each_line_whole(lines_importer: Any, tmp_path: Path) -> None:
    path = tmp_path / "names.txt"
    path.write_text("alpha\n\nbad\nbeta\n")
    report = importing.import_run(kind="lines", source=str(path), options={"prefix": "p-"})
    assert _recipes() == ["p-alpha", "p-beta"]
    assert [(line.place, line.outcome) for line in report.lines] == [
        ("line 1", "matched"),
        ("line 2", "skipped"),
        ("line 3", "refused"),
        ("line 4", "matched"),
    ]
    assert report.source == str(path) and report.kind == "lines"


@pytest.mark.django_db
def test_dry_run_stores_nothing_and_reports_the_same(lines_importer: Any, tmp_path: Path) -> None:
    path = tmp_path / "names.txt"
    path.write_text("alpha\nbad\n")
    report = importing.import_run(kind="lines", source=str(path), dry_run=True)
    assert _recipes() == []
    assert (report.matched_count, report.refused_count) == (1, 1)
    assert "would import 1" in report.summary() and "dry run" in report.summary()


@pytest.mark.django_db
def test_file_url_is_read_through_fsspec(lines_importer: Any, tmp_path: Path) -> None:
    path = tmp_path / "names.txt"
    path.write_text("gamma\n")
    report = importing.import_run(kind="lines", source=f"file://{path}")
    assert report.matched_count == 1 and _recipes() == ["gamma"]


@pytest.mark.django_db
def test_unknown_url_scheme_is_refused_in_the_report(lines_importer: Any) -> None:
    report = importing.import_run(kind="lines", source="ftp://example.invalid/names.txt")
    assert report.refused_count == 1 and report.matched_count == 0
    assert "'ftp:' is not one this site reads" in report.lines[0].reason


@pytest.mark.django_db
def test_missing_file_is_refused_in_the_report(lines_importer: Any, tmp_path: Path) -> None:
    report = importing.import_run(kind="lines", source=str(tmp_path / "absent.txt"))
    assert report.refused_count == 1 and "cannot be read" in report.lines[0].reason


@pytest.mark.django_db
def test_file_over_the_cap_is_refused_before_reading(
    lines_importer: Any, tmp_path: Path, settings: Any
) -> None:
    settings.IMPORTS_MAX_BYTES = 10
    path = tmp_path / "names.txt"
    path.write_text("alpha\nbeta\ngamma\n")
    report = importing.import_run(kind="lines", source=str(path))
    assert _recipes() == []
    assert report.refused_count == 1 and "the limit is 10 bytes" in report.lines[0].reason


@pytest.mark.django_db
def test_stream_over_the_cap_keeps_whole_items_and_says_so(
    lines_importer: Any, settings: Any
) -> None:
    settings.IMPORTS_MAX_BYTES = 8  # no size is announced: the reader stops at the cap
    stream = io.BufferedReader(io.BytesIO(b"alpha\nbeta\ngamma\n"), buffer_size=6)
    report = importing.import_run(kind="lines", source=stream, source_name="pipe")
    assert report.refused_count == 1
    assert "larger than the limit of 8 bytes" in report.lines[-1].reason
    assert _recipes() == [line.reason.removeprefix("recipe ") for line in report.lines[:-1]]


@pytest.mark.django_db
def test_unknown_kind_and_options_are_refused(lines_importer: Any) -> None:
    with pytest.raises(importing.ImportRefused, match="no importer of kind 'nope'"):
        importing.import_run(kind="nope", source="-")
    with pytest.raises(importing.ImportRefused, match="takes no option colour"):
        importing.import_run(kind="lines", source="-", options={"colour": "red"})


@pytest.mark.django_db
def test_command_prints_the_report_and_fails_when_something_is_refused(
    lines_importer: Any, tmp_path: Path
) -> None:
    path = tmp_path / "names.txt"
    path.write_text("alpha\nbad\n")
    out = io.StringIO()
    with pytest.raises(CommandError, match="1 refused"):
        call_command("import_history", "lines", str(path), "-o", "prefix=x-", stdout=out)
    assert out.getvalue().splitlines()[:2] == [
        "line 1: matched: recipe x-alpha",
        "line 2: refused: the word 'bad' matches nothing",
    ]
    assert _recipes() == ["x-alpha"]


@pytest.mark.django_db
def test_command_succeeds_when_nothing_is_refused_and_dry_runs(
    lines_importer: Any, tmp_path: Path
) -> None:
    path = tmp_path / "names.txt"
    path.write_text("alpha\n\n")
    out = io.StringIO()
    call_command("import_history", "lines", str(path), "--dry-run", stdout=out)
    assert "would import 1, skipped 1, refused 0 (dry run: nothing stored)." in out.getvalue()
    assert _recipes() == []


@pytest.mark.django_db
def test_command_refuses_an_unknown_kind(lines_importer: Any) -> None:
    with pytest.raises(CommandError, match="no importer of kind 'nope'"):
        call_command("import_history", "nope", "-")


# --- the page ---------------------------------------------------------------------------------


@pytest.mark.django_db
def test_imports_page_is_for_maintainers_only(client: Any, contributor: Any) -> None:
    assert client.get("/imports/").status_code == 403
    client.force_login(contributor)
    assert client.get("/imports/").status_code == 403


@pytest.mark.django_db
def test_imports_page_uploads_and_shows_the_report(
    client: Any, maintainer: Any, lines_importer: Any
) -> None:
    client.force_login(maintainer)
    page = client.get("/imports/")
    assert page.status_code == 200 and b"Lines of names" in page.content
    upload = io.BytesIO(b"alpha\nbad\n")
    upload.name = "names.txt"
    answer = client.post(
        "/imports/", {"kind": "lines", "file": upload, "prefix": "w-", "dry_run": ""}
    )
    assert answer.status_code == 200
    text = answer.content.decode()
    assert "the word &#x27;bad&#x27; matches nothing" in text
    assert "imported 1, skipped 0, refused 1" in text
    assert _recipes() == ["w-alpha"]


@pytest.mark.django_db
def test_imports_page_dry_run_and_url(
    client: Any, maintainer: Any, lines_importer: Any, settings: Any
) -> None:
    import fsspec

    settings.IMPORTS_URL_SCHEMES = ["memory"]  # fsspec's own in-memory file system
    with fsspec.open("memory://imports/names.txt", "wb") as handle:
        handle.write(b"alpha\n")
    client.force_login(maintainer)
    url = "memory://imports/names.txt"
    answer = client.post("/imports/", {"kind": "lines", "url": url, "dry_run": "on"})
    assert answer.status_code == 200 and b"would import 1" in answer.content
    assert _recipes() == []


@pytest.mark.django_db
def test_imports_page_never_reads_a_file_of_the_server(
    client: Any, maintainer: Any, lines_importer: Any, tmp_path: Path
) -> None:
    path = tmp_path / "names.txt"
    path.write_text("alpha\n")
    client.force_login(maintainer)
    for url in (str(path), f"file://{path}"):
        answer = client.post("/imports/", {"kind": "lines", "url": url})
        assert answer.status_code == 400
        assert b"A file on the server is not read from the page" in answer.content
    assert _recipes() == []


@pytest.mark.django_db
def test_imports_page_refuses_in_words(client: Any, maintainer: Any, lines_importer: Any) -> None:
    client.force_login(maintainer)
    answer = client.post("/imports/", {"kind": "lines", "url": "ftp://x/y"})
    assert answer.status_code == 400 and b"is not one this site reads" in answer.content
    answer = client.post("/imports/", {"kind": "lines"})
    assert answer.status_code == 400 and b"Choose a file to import." in answer.content
    answer = client.post("/imports/", {"kind": "unknown"})
    assert answer.status_code == 400


@pytest.mark.django_db
def test_maintainer_group_member_may_import(client: Any, contributor: Any) -> None:
    contributor.groups.add(Group.objects.get_or_create(name="maintainer")[0])
    client.force_login(contributor)
    assert client.get("/imports/").status_code == 200


@pytest.mark.django_db
def test_imports_page_takes_uploads_past_the_request_cap_up_to_its_own(
    client: Any, maintainer: Any, lines_importer: Any, settings: Any
) -> None:
    settings.REQUEST_BODY_CAP = 1024
    settings.IMPORTS_MAX_BYTES = 64 * 1024
    client.force_login(maintainer)
    upload = io.BytesIO(b"alpha\n" + b"\n" * 4000)  # over the request cap, under the importers'
    upload.name = "names.txt"
    answer = client.post("/imports/", {"kind": "lines", "file": upload})
    assert answer.status_code == 200 and b"imported 1, skipped 4000" in answer.content
    big = io.BytesIO(b"\n" * (70 * 1024))
    big.name = "big.txt"
    answer = client.post("/imports/", {"kind": "lines", "file": big})
    assert answer.status_code == 413
