"""The board's doors (``/board/``, ``/board/runs.json``, ``/api/v1/board/``): the entries of
``runs.board.read`` with the links only proposals/ may add (the proposal, its GitHub issue,
its author)."""
