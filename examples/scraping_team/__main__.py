"""``python -m examples.scraping_team``: run the scraping team once and print the steps memory saved.

Exit code 0 when every product was extracted correctly with and without memory, the
conflicting selector was settled by an accepted vote, the outvoted pattern was pruned and
memory saved steps; 1 otherwise (including a timeout or an unreachable server).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from blackboard.protocol.errors import AuthenticationError, BlackboardError, NotConnectedError
from blackboard.settings import Settings
from examples.scraping_team.team import ScrapeConfig, run_scraping_team


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    defaults = ScrapeConfig()
    p = argparse.ArgumentParser(prog="python -m examples.scraping_team",
                                description="Three scouts extract a local shop site and share selectors "
                                            "through the blackboard's memory.")
    p.add_argument("--nats-url", default=None,
                   help="NATS server (default: settings, i.e. BLACKBOARD_NATS__URL or nats://127.0.0.1:4222)")
    p.add_argument("--team", default=None, help="team name: board name and agent id prefix (default: team-<random>)")
    p.add_argument("--timeout", type=float, default=defaults.timeout, help="seconds the whole run may take")
    p.add_argument("--step-timeout", type=float, default=defaults.step_timeout,
                   help="seconds a pattern may take to become searchable, and a vote to be committed")
    p.add_argument("--connect-timeout", type=float, default=defaults.connect_timeout,
                   help="seconds to wait for the NATS server")
    p.add_argument("--quiet", action="store_true", help="print only the summary")
    p.add_argument("--json", action="store_true", help="also print the result as one JSON line")
    return p.parse_args(argv)


async def _main(args: argparse.Namespace) -> int:
    settings = Settings()
    if args.nats_url:
        settings = settings.model_copy(update={"nats": settings.nats.model_copy(update={"url": args.nats_url})})
    config = ScrapeConfig(team=args.team, timeout=args.timeout, step_timeout=args.step_timeout,
                          connect_timeout=args.connect_timeout)
    try:
        result = await run_scraping_team(settings, config, echo=None if args.quiet else print)
    except NotConnectedError as exc:
        print(f"error: {exc} (is `blackboard dev` running? see examples/scraping_team/README.md)", file=sys.stderr)
        return 1
    except TimeoutError:
        print(f"error: the team did not finish within {config.timeout:g}s", file=sys.stderr)
        return 1
    except AuthenticationError as exc:
        print(f"error: AuthenticationError: {exc}", file=sys.stderr)
        print("hint: the scouts (team-<name>-scout-1, -2, -3) are issued their credentials by the identity "
              "authority of `blackboard dev`: run this from the directory `blackboard dev` runs in (or set "
              "BLACKBOARD_DEV__DATA_DIR to its data directory); see examples/scraping_team/README.md",
              file=sys.stderr)
        return 1
    except BlackboardError as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print()
    print(result.summary())
    if args.json:
        print(json.dumps({
            "team": result.team, "ok": result.ok, "saved": result.saved,
            "steps_with_memory": result.steps_with_memory, "steps_without_memory": result.steps_without_memory,
            "votes": [{"proposal": v.proposal_id, "shop": v.shop, "field": v.field, "status": v.status,
                       "winner": v.winner, "committed": v.committed} for v in result.votes],
            "pruned": result.pruned, "final_patterns": result.final_patterns, "problems": result.problems,
        }, sort_keys=True))
    return 0 if result.ok else 1


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    return asyncio.run(_main(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
