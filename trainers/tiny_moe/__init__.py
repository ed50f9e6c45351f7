"""The tiny recipe's trainer: a mixture-of-experts transformer that trains on a laptop CPU.

``python -m trainers.tiny_moe --config config.json`` runs ``train.main``. Its corpus is
``data``, its model ``model`` (numpy only), its entrypoint, config and loop ``train``.
"""
