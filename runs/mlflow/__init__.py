"""The MLflow tracking REST API, the subset the stock ``mlflow`` client calls for tracking.

An MLflow experiment is a plan (``experiment_id`` is the plan's id, its name ``plan-<id>``);
an MLflow run is a run of it (``run_id`` is the run's id). Writes go through the same
services as the native doors: points through ``runs.metrics.ingest.metrics_ingest``, params and
tags through ``runs.trackers.reports``, states through ``runs.services.runs.run_transition``.
``errors`` holds MLflow's error shape, ``protocol`` reads requests and writes entities as
MLflow's JSON does, ``services`` maps the writes onto runs, ``selectors`` the reads,
``views`` is the door.
"""
