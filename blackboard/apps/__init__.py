"""Programs on top of everything: the ``blackboard`` command line.

The only layer that may import both the server side and :mod:`agents_sdk`,
because these programs act as agents.
"""
