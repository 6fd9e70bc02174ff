"""Client IO on NATS: connection, publisher, streams, the board store and the consensus store.

Imports :mod:`blackboard.protocol` (and :mod:`blackboard.consensus`, which is
pure); used by the SDK, the worker and the apps.
"""
