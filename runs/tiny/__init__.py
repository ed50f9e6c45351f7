"""The tiny recipe's pieces: its corpus (``data``) and its model (``model``), numpy only.

The entrypoint, its config and its training loop are ``runs.tiny_moe``.
"""
