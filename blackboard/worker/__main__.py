"""``python -m blackboard.worker``: run one worker process with settings from the environment.

Prints ``ready`` on stdout once every component is up (and logs its lifecycle
at ``observability.log_level``, INFO by default, on stderr); stops cleanly on SIGTERM / SIGINT (unacknowledged work is
redelivered to the other workers of its group). Invalid settings exit with 2,
other start-up errors with 1, each as one line.
"""

from __future__ import annotations

import asyncio
import signal
import sys

from pydantic import ValidationError

from blackboard.observability import configure_logging
from blackboard.protocol.errors import BlackboardError, ConfigurationError
from blackboard.settings import Settings, describe_errors
from blackboard.worker.runner import Worker


async def _main(settings: Settings) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with Worker(settings):  # fully up here, or it raised
        print("ready", flush=True)
        await stop.wait()


def main() -> int:
    """Entry point; returns the process exit code."""
    try:
        settings = Settings()
    except ValidationError as exc:
        print(f"blackboard worker: error: {describe_errors(exc)}", file=sys.stderr)
        return 2
    # observability.log_level (INFO) and log_format (text, or json for log shippers)
    configure_logging(settings.observability, force=False)
    try:
        asyncio.run(_main(settings))
    except ConfigurationError as exc:
        print(f"blackboard worker: error: {exc}", file=sys.stderr)
        return 2
    except BlackboardError as exc:
        print(f"blackboard worker: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
