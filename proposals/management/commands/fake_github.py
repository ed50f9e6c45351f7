"""Serve the fake GitHub (proposals/github/fake.py) so the demo syncs without an account."""

from __future__ import annotations

import time
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand

from proposals.github.fake import FakeGitHub


class Command(BaseCommand):
    help = "Serve a fake GitHub API for GITHUB_REPOSITORY on 127.0.0.1 (GITHUB_FAKE_PORT)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--port", type=int, default=settings.GITHUB_FAKE_PORT)
        parser.add_argument("--bot-login", default=settings.GITHUB_BOT_LOGIN or "marin-site-bot")

    def handle(self, *args: Any, **options: Any) -> None:
        fake = FakeGitHub(
            repository=settings.GITHUB_REPOSITORY or "marin-community/marin",
            bot_login=options["bot_login"],
            port=options["port"],
        ).start()
        self.stdout.write(f"fake GitHub for {fake.repository} at {fake.url}")
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            fake.stop()
