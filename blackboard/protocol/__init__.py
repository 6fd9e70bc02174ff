"""The wire protocol: errors, subjects and keys, codec, wire schemas and records.

The bottom layer: it imports nothing else of this project. Everything that
crosses the bus is named (:mod:`.subjects`), encoded (:mod:`.codec`; one
canonical encoding per record in :mod:`.canonical`) and shaped
(:mod:`.schemas`, one schema per record, with the fast paths of the hot
records beside them in :mod:`.records`; :mod:`.entries`) here; see
``docs/protocol.md``.
"""
