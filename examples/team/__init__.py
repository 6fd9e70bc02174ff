"""A team of three agents (a planner, two actors) on the blackboard: board, messages, one vote.

Run it with ``python -m examples.team`` against ``blackboard dev``; see README.md.
"""

from examples.team.agents import Actor, Mailbox, Planner, Transcript
from examples.team.policy import LLMPolicy, Policy, ScriptedPolicy
from examples.team.team import TeamConfig, TeamResult, open_policy, run_team

__all__ = [
    "Actor",
    "LLMPolicy",
    "Mailbox",
    "Planner",
    "Policy",
    "ScriptedPolicy",
    "TeamConfig",
    "TeamResult",
    "Transcript",
    "open_policy",
    "run_team",
]
