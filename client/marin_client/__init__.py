"""marin-site-client: what runs on a training machine and talks to a marin-site.

- ``client``: ``RunClient``, the run client a training job reports through (metrics,
  heartbeats, status, config, summary);
- ``levanter``: a Levanter tracker (``type: marin_site``) built on that client;
- ``agent``: the agent program that serves a pool's runs on someone else's machine.

Standard library only, except ``levanter``, which imports Levanter. ``client`` and ``agent``
are each one self-contained file: the site also serves them alone, so a machine with
nothing but Python can fetch them (``standalone_file``).
"""

from __future__ import annotations

from pathlib import Path

STANDALONE = ("agent", "client")


def standalone_file(module: str) -> Path:
    """The path of one of the self-contained modules, served as a single file by the site."""
    if module not in STANDALONE:
        raise ValueError(f"{module!r} is not one of the standalone modules {STANDALONE}")
    return Path(__file__).resolve().parent / f"{module}.py"
