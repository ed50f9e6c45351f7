"""Trainers the project ships: programs that run on a training machine, not in the site.

``tiny_moe`` is the demo recipe's trainer (numpy on one CPU core). A trainer reports through
``marin_client`` like any other training code; it never imports the site.
"""
