"""``python -m trainers.tiny_moe --config config.json``: the tiny recipe's command."""

from trainers.tiny_moe.train import main

raise SystemExit(main())
