"""Downsampled metric series: the rollup that charts read instead of points.

``buckets`` holds the packed buckets and their exact merges (numpy), ``rollup`` keeps each
(run, key)'s rollup from the points, ``charts`` reads it for one series or for the charts
of many runs.

A proposal page draws 64 runs x 4 keys of 100,000 steps each: 25.6M points, which no
request can scan. Each (run, key) therefore keeps a ``MetricSeries``: the points cut into
buckets of ``width`` steps (a power of two) counted from ``origin`` (the lowest step), at most
``MAX_BUCKETS`` of them, each with its point count, sum, min and max, its highest step, and
the steps where the min and the max were reached. Buckets merge exactly (counts and sums
add; min, max and last are taken), so:

- a read for N points merges neighbouring buckets until at most N remain: one query for all
  the series of a page and a few numpy calls over all of them together, whatever the length
  of the runs. A second copy with ``COARSE`` buckets in one serves the usual short reads
  (a page asks for 500 points) with a quarter of the bytes;
- a run that grows doubles ``width`` and merges pairs, instead of rereading its points.

The rollup is kept by a refresh, not by each ingest: an ingest marks the keys it wrote
stale from their lowest written step (``MetricSummary.stale_from``) and asks for a refresh
of the run at most once every ``RUNS_SERIES_REFRESH_SECONDS`` (debounced in the cache). The
refresh rebuilds only the buckets from the stale step on, from the points, so it is exact
whatever the order in which points arrived and whatever was resent. A run that ends is
refreshed at once; a periodic sweep (Celery beat) refreshes whatever a lost message left
stale. Until then a chart lags by a few seconds, and ``active`` stays true.
"""
