"""The board: tracks (a recipe, a metric and a ranking rule) and their entries, read from
finished runs with each run's provenance (``runs.board.models``, ``runs.board.read``)."""
