"""Runnable examples of the blackboard SDK (``python -m examples.team``)."""
