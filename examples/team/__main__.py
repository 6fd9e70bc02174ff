"""``python -m examples.team``: run the three-agent team once and print what happened.

Exit code 0 when every task was done exactly once and the vote's result is on
the board; 1 otherwise (including a timeout or an unreachable server).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import get_args

from blackboard.protocol.errors import AuthenticationError, BlackboardError, NotConnectedError
from blackboard.settings import Settings
from examples.team.team import PolicyChoice, TeamConfig, run_team


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    defaults = TeamConfig()
    p = argparse.ArgumentParser(prog="python -m examples.team",
                                description="A planner and two actors coordinate through the blackboard.")
    p.add_argument("--nats-url", default=None,
                   help="NATS server (default: settings, i.e. BLACKBOARD_NATS__URL or nats://127.0.0.1:4222)")
    p.add_argument("--goal", default=defaults.goal, help=f"what the team works on (default: {defaults.goal!r})")
    p.add_argument("--tasks", type=int, default=defaults.tasks, help=f"tasks in the plan (default {defaults.tasks})")
    p.add_argument("--team", default=None, help="team name: board name and agent id prefix (default: random)")
    p.add_argument("--policy", choices=get_args(PolicyChoice), default=defaults.policy,
                   help="auto (default): the LLM when BLACKBOARD_LLM__API_KEY or __BASE_URL is set, else scripted")
    p.add_argument("--timeout", type=float, default=defaults.timeout, help="seconds the whole run may take")
    p.add_argument("--step-timeout", type=float, default=defaults.step_timeout,
                   help="seconds any single wait may take")
    p.add_argument("--connect-timeout", type=float, default=defaults.connect_timeout,
                   help="seconds to wait for the NATS server")
    p.add_argument("--quiet", action="store_true", help="print only the summary")
    p.add_argument("--json", action="store_true", help="also print the result as one JSON line")
    args = p.parse_args(argv)
    if args.tasks < 1:
        p.error("--tasks must be at least 1")
    return args


async def _main(args: argparse.Namespace) -> int:
    settings = Settings()
    if args.nats_url:
        settings = settings.model_copy(update={"nats": settings.nats.model_copy(update={"url": args.nats_url})})
    config = TeamConfig(goal=args.goal, tasks=args.tasks, team=args.team, timeout=args.timeout,
                        step_timeout=args.step_timeout, connect_timeout=args.connect_timeout,
                        policy=args.policy)
    try:
        result = await run_team(settings, config, echo=None if args.quiet else print)
    except NotConnectedError as exc:
        print(f"error: {exc} (is `blackboard dev` running? see examples/team/README.md)", file=sys.stderr)
        return 1
    except TimeoutError:
        print(f"error: the team did not finish within {config.timeout:g}s", file=sys.stderr)
        return 1
    except AuthenticationError as exc:
        print(f"error: AuthenticationError: {exc}", file=sys.stderr)
        print("hint: the team's agents (team-<name>-planner, -actor-1, -actor-2) are issued their credentials "
              "by the identity authority of `blackboard dev`: run this from the directory `blackboard dev` "
              "runs in (or set BLACKBOARD_DEV__DATA_DIR to its data directory); see examples/team/README.md",
              file=sys.stderr)
        return 1
    except BlackboardError as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print()
    print(result.summary())
    if args.json:
        print(json.dumps({"team": result.team, "policy": result.policy, "ok": result.ok,
                          "done_by": result.done_by, "conflicts": result.conflicts,
                          "outcome": result.outcome_status, "problems": result.problems}, sort_keys=True))
    return 0 if result.ok else 1


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    return asyncio.run(_main(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
