"""The maintainers' page of imports, ``/imports/``: choose a kind, give a file (or, for an
importer that reads URLs, a URL) and the importer's options, check it with a dry run or
import it; the report is shown on the page. The same service as ``manage.py
import_history`` (``marin_site.importing.import_run``)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from marin_site import importing


class ImportForm(forms.Form):
    kind = forms.ChoiceField(label="What the source holds")
    file = forms.FileField(required=False, label="File")
    url = forms.CharField(
        required=False,
        max_length=2000,
        label="Or a URL",
        help_text="For importers that read URLs (file://, gs://): read where it lies.",
    )
    dry_run = forms.BooleanField(
        required=False, initial=True, label="Dry run: check and report, store nothing"
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        registered = importing.importers()
        kind_field = self.fields["kind"]
        assert isinstance(kind_field, forms.ChoiceField)
        kind_field.choices = [(i.kind, i.label) for i in registered]
        self.option_names: list[str] = []
        for importer in registered:
            for option in importer.options:
                if option.name in self.fields:
                    continue
                users = [i.label for i in registered if option.name in {o.name for o in i.options}]
                self.fields[option.name] = forms.CharField(
                    required=False,
                    max_length=500,
                    label=option.label,
                    help_text=(option.help + " " if option.help else "") + f"({'; '.join(users)})",
                )
                self.option_names.append(option.name)

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        kind = data.get("kind")
        if not kind:
            return data
        importer = importing.importer_get(kind)
        has_file, url = bool(data.get("file")), (data.get("url") or "").strip()
        if has_file and url:
            raise forms.ValidationError("Give a file or a URL, not both.")
        if url and not importer.accepts_url:
            self.add_error("url", f"The importer '{importer.label}' reads uploaded files only.")
        elif url:
            problem = importing.source_check(url)
            if importing.source_is_local(url):
                problem = "a file on the server is not read from the page: upload it instead"
            if problem:
                self.add_error("url", problem[0].upper() + problem[1:] + ".")
        elif not has_file:
            self.add_error("file", "Choose a file to import.")
        declared = {o.name for o in importer.options}
        for name in self.option_names:
            if data.get(name) and name not in declared:
                self.add_error(name, f"The importer '{importer.label}' takes no {name}.")
        for option in importer.options:
            value = (data.get(option.name) or "").strip()
            if option.source and value and importing.source_is_local(value):
                self.add_error(option.name, "A file on the server is not read from the page.")
        data["url"] = url
        return data


def imports_page(request: HttpRequest) -> HttpResponse:
    if not request.user.has_perm(importing.IMPORT_PERMISSION):
        raise PermissionDenied("Only maintainers import the project's past.")
    report = None
    status = 200
    if request.method == "POST":
        form = ImportForm(request.POST, request.FILES)
        if form.is_valid():
            data = form.cleaned_data
            options = {n: data[n] for n in form.option_names if data.get(n)}
            source = data["url"] or data["file"]
            try:
                report = importing.import_run(
                    kind=data["kind"],
                    source=source,
                    by=request.user,
                    dry_run=data["dry_run"],
                    options=options,
                    source_name=data["url"] or data["file"].name,
                )
            except importing.ImportRefused as exc:
                form.add_error(None, exc.message)
                status = 400
        else:
            status = 400
    else:
        form = ImportForm()
    return render(
        request,
        "imports.html",
        {"form": form, "report": report, "importers": importing.importers()},
        status=status,
    )
