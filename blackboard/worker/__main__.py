"""``python -m blackboard.worker``: run one worker process with settings from the environment.

Prints ``ready`` on stdout once every component is up; stops cleanly on
SIGTERM / SIGINT (unacknowledged work is redelivered to the other workers).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from blackboard.protocol.errors import BlackboardError
from blackboard.settings import Settings
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
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    try:
        asyncio.run(_main(Settings()))
    except BlackboardError as exc:
        print(f"blackboard worker: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
