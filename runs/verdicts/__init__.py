"""Verdict rules as plug-ins: named, versioned pure functions with declared parameters.

``base`` (parameters, refusals, the verdict and its arithmetic), ``gates`` (Marin's Agent MoE
gates: ``effective_speedup``, ``pinned_refit``), ``speedrun`` (``speedrun_threshold``,
``speedrun_scaling``), ``ladder`` (the site's ladder rule), ``rules`` (the registry and
``verdict_compute``, the one entry every door uses).
"""
