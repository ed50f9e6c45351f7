"""The writes of runs/, by noun: ``recipes``, ``plans``, ``runs`` (transitions, history,
cancel, rerun, retry), ``dispatch`` (expansion, capacity, dispatch, the job) and
``reconcile`` (the reconciler). Import the module you need; nothing is re-exported here."""
