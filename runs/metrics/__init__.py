"""Metrics in: ``parse`` checks a runner's batch, ``ingest`` writes it (with the running
summaries, the heartbeat and the rate limit), ``points`` reads the points back (keys, CSV).
The downsampled series that charts read are ``runs.series``'.

Values must be finite numbers. NaN and infinities are refused (400) rather than stored:
JSON has no spelling for them, SQLite cannot keep NaN, and a summary's min or max would be
poisoned by one. A run that diverges says so with its final status (``failed``, with the
step where the loss stopped being finite in the message).
"""
