"""Pools of machines that other people own, their agents, and the leases by which an agent
holds one run at a time (issue #16: runs on anyone's compute).

``models`` holds the rows, ``services`` the rules (tokens, registration, leases, revocation),
``wakeup`` how a waiting long-poll learns that work arrived, ``api`` the agents' door and
``views`` the pool pages. The agent program itself is ``client/marin_client/agent.py`` (standard library
only), and the ``pool:<name>`` executor is ``runs/executors/pool.py``.
"""
