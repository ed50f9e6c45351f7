"""Static files in production: whitenoise's compressed files under hashed names, and pages
that still answer when the files were not collected.

Django's manifest storage raises for a name missing from the manifest that ``collectstatic``
writes, so a site started without ``collectstatic`` (or a template naming a file added since)
answered every page with a 500. Here such a name is linked as it is, unhashed, and the log
says what to run; the page answers, without its styles until the files are collected.
"""

from __future__ import annotations

import logging

from whitenoise.storage import CompressedManifestStaticFilesStorage

logger = logging.getLogger(__name__)

_reported: set[str] = set()


class StaticFilesStorage(CompressedManifestStaticFilesStorage):
    def stored_name(self, name: str) -> str:
        try:
            return super().stored_name(name)
        except ValueError:
            if name not in _reported:
                _reported.add(name)
                logger.error(
                    "static file %r is not among the collected files (%s): pages link it "
                    "unhashed until `manage.py collectstatic --noinput` is run",
                    name,
                    self.location,
                )
            return name
