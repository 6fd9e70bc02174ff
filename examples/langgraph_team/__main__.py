"""``python -m examples.langgraph_team``: a researcher and a writer run one LangGraph thread
on the blackboard; or, with ``--member``, one member's turn (run each in its own process).

Exit code 0 when the team finished with the notes approved, every step written by the
member whose node it is, and the findings and notes in the store (with ``--member``: the
turn ran, or it was not this member's); 1 otherwise (a timeout, an unreachable server).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from blackboard.protocol.errors import AuthenticationError, BlackboardError, NotConnectedError
from blackboard.settings import Settings
from examples.langgraph_team.team import TeamConfig, member_id, run_team, run_turn


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    defaults = TeamConfig()
    p = argparse.ArgumentParser(prog="python -m examples.langgraph_team",
                                description="Two agents share a LangGraph thread's checkpoints and store "
                                            "on the blackboard.")
    p.add_argument("--nats-url", default=None,
                   help="NATS server (default: settings, i.e. BLACKBOARD_NATS__URL or nats://127.0.0.1:4222)")
    p.add_argument("--topic", default=defaults.topic, help=f"what the notes are about (default: {defaults.topic!r})")
    p.add_argument("--team", default=None,
                   help="team name: agent id prefix and thread id (default: team-<random>)")
    p.add_argument("--member", choices=["researcher", "writer"], default=None,
                   help="run only this member's turn on --team's thread, then exit")
    p.add_argument("--checkpoint-board", default=defaults.checkpoint_board,
                   help=f"board of the checkpoints (default {defaults.checkpoint_board})")
    p.add_argument("--store-board", default=defaults.store_board,
                   help=f"board of the store (default {defaults.store_board})")
    p.add_argument("--timeout", type=float, default=defaults.timeout, help="seconds the whole run may take")
    p.add_argument("--connect-timeout", type=float, default=defaults.connect_timeout,
                   help="seconds to wait for the NATS server")
    p.add_argument("--quiet", action="store_true", help="print only the summary")
    p.add_argument("--json", action="store_true", help="also print the result as one JSON line")
    args = p.parse_args(argv)
    if args.member and not args.team:
        p.error("--member needs --team (the thread to take a turn on)")
    return args


async def _main(args: argparse.Namespace) -> int:
    settings = Settings()
    if args.nats_url:
        settings = settings.model_copy(update={"nats": settings.nats.model_copy(update={"url": args.nats_url})})
    config = TeamConfig(topic=args.topic, team=args.team, checkpoint_board=args.checkpoint_board,
                        store_board=args.store_board, timeout=args.timeout, connect_timeout=args.connect_timeout)
    try:
        if args.member:
            turn = await asyncio.wait_for(run_turn(settings, config, args.member), config.timeout)
            waits = f"the thread waits on {turn.next!r}" if turn.next else "the thread is done"
            print(f"{member_id(args.team, args.member)} ran {', '.join(turn.ran) or 'nothing'}; {waits}")
            if args.json:
                print(json.dumps({"member": args.member, "ran": list(turn.ran), "next": turn.next}))
            return 0
        result = await run_team(settings, config, echo=None if args.quiet else print)
    except NotConnectedError as exc:
        print(f"error: {exc} (is `blackboard dev` running? see examples/langgraph_team/README.md)", file=sys.stderr)
        return 1
    except TimeoutError:
        print(f"error: the team did not finish within {config.timeout:g}s", file=sys.stderr)
        return 1
    except AuthenticationError as exc:
        print(f"error: AuthenticationError: {exc}", file=sys.stderr)
        print("hint: the members (team-<name>-researcher, -writer) are issued their credentials by the identity "
              "authority of `blackboard dev`: run this from the directory `blackboard dev` runs in (or set "
              "BLACKBOARD_DEV__DATA_DIR to its data directory); see examples/langgraph_team/README.md",
              file=sys.stderr)
        return 1
    except BlackboardError as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print()
    print(result.summary())
    if args.json:
        print(json.dumps({"team": result.team, "ok": result.ok, "approved": result.approved,
                          "history": result.history, "facts": len(result.facts),
                          "notes_by": (result.notes or {}).get("approved_by"), "problems": result.problems}))
    return 0 if result.ok else 1


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    return asyncio.run(_main(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
