"""What a plan is made of, before any database: an ablation spec parsed, expanded into runs
and priced (``ablation``), and a recipe's compute model (``compute``: FLOPs and
accelerator-hours of one run). Pure functions; the writes that freeze a plan are
``runs.services.plans``.
"""
