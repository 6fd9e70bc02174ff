"""Consensus voting, pure: the tally of ballots under a policy and a proposal's message log.

No IO: the SDK, the worker and a recount from PostgreSQL all feed the same log,
so they agree. The IO around it is :mod:`blackboard.client.consensus`.
"""
