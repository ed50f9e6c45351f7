"""Campaigns: a long training run told in public (issue #18).

A campaign is one named run made of several ``runs.Run`` rows (restarts and phases), with
its target, its interventions and, optionally, the ladder plan that predicted it. Models in
``models`` (registered through ``runs.models``), writes in ``services``, reads in
``selectors`` (the stitched chart data in ``stitching``, the projection in ``projection``).
"""
