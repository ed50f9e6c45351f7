"""Kept for recipe versions stored before the trainer moved: ``{python} -m runs.tiny_moe``.

The trainer is ``trainers.tiny_moe`` (``python -m trainers.tiny_moe``); this runs it.
"""

from trainers.tiny_moe.train import main

if __name__ == "__main__":
    raise SystemExit(main())
