"""Ready blackboard stacks for test suites: NATS with JetStream, PostgreSQL + pgvector and a
worker, embedded (child processes) or in containers (testcontainers), with authorization and
TLS; and the pytest plugin (``blackboard.testing.plugin``) that hands them out as fixtures
(docs/testing.md)."""

from blackboard.testing.containers import LABEL, ContainerStack, sweep_containers
from blackboard.testing.embedded import EmbeddedStack
from blackboard.testing.environment import settings_env
from blackboard.testing.identities import TEST_POLICY, StackIdentities
from blackboard.testing.modes import make_stack
from blackboard.testing.stack import Stack, StackMode, run_sync

__all__ = [
    "LABEL",
    "TEST_POLICY",
    "ContainerStack",
    "EmbeddedStack",
    "Stack",
    "StackIdentities",
    "StackMode",
    "make_stack",
    "run_sync",
    "settings_env",
    "sweep_containers",
]
