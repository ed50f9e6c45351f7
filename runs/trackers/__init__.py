"""What trackers bring besides the native metrics door: a ``tracker_metrics.jsonl`` imported
whole (``jsonl``) or uploaded in chunks (``uploads``), the config, summary and tags they
report (``reports``) and the links a run reports about itself (``artifacts``). The MLflow
door is ``runs.mlflow``; every door writes points through ``runs.metrics.ingest``.
"""
