"""Outgoing GitHub writes: stored in the outbox with the change, sent after commit, in order.

``enqueue`` adds rows inside the caller's transaction; ``drain`` sends a proposal's rows
one at a time through ``send``, which writes what ``render`` produces.
"""
