"""MCP benchmark: a tool call through the MCP server next to the same SDK call, in one run.

Measures, on a nats-server it starts itself (authorization and TLS as ``blackboard dev`` runs
them; ``--insecure-open-bus`` for the open bus), the latency of

* ``board_get`` (one entry of ``--keys`` keys, written beforehand by another identity, so each
  reader verifies its signature once) and
* ``board_put`` (a value of ``--value-bytes``, signed by the writer),

called as an MCP tool by an ``mcp`` ``ClientSession`` over

* stdio: a ``blackboard mcp --stdio --as bench-stdio`` process, and
* streamable HTTP: a ``blackboard mcp --http --port 0`` process, the client sending its bearer
  token (a stateful session, SSE responses: the SDK's defaults),

next to ``Board.get`` / ``Board.put`` of an SDK agent in this process (the baseline: what the
server itself does for each tool call, without MCP). The three variants run in alternating
blocks of ``--block`` sequential calls (``interleaved_ops``), so that noise hits all alike;
figures are medians over ``--rounds`` rounds of p50 and p99, ratios MCP / SDK, and the note
says what MCP adds to the p50 (JSON-RPC encoding and validation on both sides, a process hop,
the tool's result model).

Run: ``python bench/mcp_bench.py`` (about a minute on 2 cores; ``--rounds 2 --ops 200`` for a
quick look).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx2
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from agents_sdk import Agent
from bench._common import (
    Bus,
    LatencyStats,
    Table,
    add_bus_option,
    embedded_nats,
    interleaved_ops,
    median,
)
from blackboard.apps.mcp.tokens import TokenFile

REPO = Path(__file__).resolve().parents[1]
BOARD = "bench-mcp"
VARIANTS = ("sdk", "stdio", "http")


def _agent_env(bus: Bus, data_dir: Path) -> dict[str, str]:
    """``BLACKBOARD_*`` of an agent process on this bus: the server, the CA, the authority (which
    issues the agent its credential on first use); no process-wide credential, and a data
    directory of its own (no ``./.blackboard`` of the working directory)."""
    env = {k: v for k, v in bus.worker_env().items() if k != "BLACKBOARD_NATS__CREDS_FILE"}
    return env | {"BLACKBOARD_DEV__DATA_DIR": str(data_dir)}


@contextlib.asynccontextmanager
async def _session(streams: Any) -> AsyncIterator[ClientSession]:
    read, write = streams
    async with ClientSession(read, write) as session:
        await session.initialize()
        yield session


@contextlib.asynccontextmanager
async def _stdio(bus: Bus, data_dir: Path, errlog: Any) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(command=sys.executable, args=["-m", "blackboard", "mcp", "--stdio", "--as",
                                                                  "bench-stdio"], env=_agent_env(bus, data_dir),
                                   cwd=str(REPO))
    async with stdio_client(params, errlog=errlog) as streams, _session(streams) as session:
        yield session


@contextlib.asynccontextmanager
async def _http_server(bus: Bus, data_dir: Path, tokens: Path, errlog: Any) -> AsyncIterator[str]:
    """A ``blackboard mcp --http`` process on a free port; its URL."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLACKBOARD_")} | _agent_env(bus, data_dir)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "blackboard", "mcp", "--http", "--port", "0", "--tokens", str(tokens),
        env=env, cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=errlog)
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        if "serving MCP on" not in line:
            raise RuntimeError(f"blackboard mcp --http did not start: {line!r} (see {errlog.name})")
        yield line.split()[-1]
    finally:
        if proc.returncode is None:
            proc.terminate()
        await asyncio.wait_for(proc.wait(), 30)


@contextlib.asynccontextmanager
async def _http(url: str, token: str) -> AsyncIterator[ClientSession]:
    async with (httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                                   timeout=httpx2.Timeout(30, read=300)) as client,
                streamable_http_client(url, http_client=client) as streams,
                _session(streams) as session):
        yield session


def _tool(session: ClientSession, name: str, arguments: Callable[[int], dict[str, Any]]
          ) -> Callable[[int], Awaitable[object]]:
    async def call(i: int) -> object:
        result = await session.call_tool(name, arguments(i))
        if getattr(result, "is_error", False):
            raise RuntimeError(f"{name} failed: {getattr(result, 'content', result)}")
        return result
    return call


async def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    value = {"text": "x" * args.value_bytes}
    with tempfile.TemporaryDirectory(prefix="bb-mcp-bench-") as tmp, \
            open(Path(tmp) / "servers.log", "w") as errlog:
        async with embedded_nats(open_bus=args.insecure_open_bus) as bus:
            tokens = Path(tmp) / "tokens.json"
            token, _ = TokenFile(tokens).add("bench-http")
            print(f"mcp_bench: python {platform.python_version()}, mcp {version('mcp')}, uvicorn {version('uvicorn')}; "
                  f"{bus.label}; {args.rounds} rounds x {args.ops} calls a variant, blocks of {args.block}", flush=True)
            async with (Agent.connect("bench-writer", settings=bus.settings) as writer,
                        Agent.connect("bench-sdk", settings=bus.settings) as sdk,
                        _http_server(bus, Path(tmp), tokens, errlog) as url,
                        _stdio(bus, Path(tmp), errlog) as stdio,
                        _http(url, token) as http):
                for k in range(args.keys):
                    await writer.board(BOARD).put("get", f"k{k}", value)
                board = sdk.board(BOARD)
                keys = args.keys

                def get_args(i: int) -> dict[str, Any]:
                    return {"board": BOARD, "section": "get", "key": f"k{i % keys}"}

                def put_args(variant: str) -> Callable[[int], dict[str, Any]]:
                    return lambda i: {"board": BOARD, "section": f"put-{variant}", "key": f"k{i % keys}",
                                      "value": value}

                ops: dict[str, dict[str, Callable[[int], Awaitable[object]]]] = {
                    "board_get": {"sdk": lambda i: board.get("get", f"k{i % keys}"),
                                  "stdio": _tool(stdio, "board_get", get_args),
                                  "http": _tool(http, "board_get", get_args)},
                    "board_put": {"sdk": lambda i: board.put("put-sdk", f"k{i % keys}", value),
                                  "stdio": _tool(stdio, "board_put", put_args("stdio")),
                                  "http": _tool(http, "board_put", put_args("http"))},
                }

                def setups(op: str) -> dict[str, Callable[[int], Awaitable[Callable[[int], Awaitable[object]]]]]:
                    def setup(variant: str) -> Callable[[int], Awaitable[Callable[[int], Awaitable[object]]]]:
                        async def ready(_round: int) -> Callable[[int], Awaitable[object]]:
                            return ops[op][variant]
                        return ready
                    return {variant: setup(variant) for variant in VARIANTS}

                # Warm-up: first reads verify each key's signature, first calls load code paths.
                await interleaved_ops(1, max(args.keys, 100), 50, setups("board_get"))
                await interleaved_ops(1, 100, 50, setups("board_put"))
                results: dict[str, dict[str, list[LatencyStats]]] = {}
                for op in ops:
                    t = time.perf_counter()
                    results[op] = await interleaved_ops(args.rounds, args.ops, args.block, setups(op))
                    print(f"  {op}: done ({time.perf_counter() - t:.0f}s)", flush=True)
    table = Table(f"mcp_bench, {bus.label} (median of rounds; ratio = via MCP / the SDK call in this process)",
                  measured_label="via MCP", baseline_label="SDK call")
    summary: dict[str, float] = {}
    for op, by_variant in results.items():
        for stat in ("p50", "p99"):
            base = median([getattr(s, stat) for s in by_variant["sdk"]])
            summary[f"{op}.sdk.{stat}_ms"] = base * 1e3
            for variant, label in (("stdio", "stdio"), ("http", "HTTP")):
                measured = median([getattr(s, stat) for s in by_variant[variant]])
                ratio = median([getattr(m, stat) / getattr(b, stat)
                                for m, b in zip(by_variant[variant], by_variant["sdk"], strict=True)])
                note = f"+{(measured - base) * 1e3:.2f} ms" if stat == "p50" else ""
                table.add(f"{op} {stat}, {label}", measured, base, "ms", note=note, ratio=ratio)
                summary[f"{op}.{variant}.{stat}_ms"] = measured * 1e3
    print()
    print(table.render())
    print(f"total {time.perf_counter() - started:.0f}s")
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description="MCP benchmark: a tool call via the MCP server (stdio, HTTP) "
                                                 "next to the same SDK call.")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (default 5)")
    parser.add_argument("--ops", type=int, default=400, help="sequential calls per round and variant (default 400)")
    parser.add_argument("--block", type=int, default=50,
                        help="sequential calls per block; the variants' blocks alternate (default 50)")
    parser.add_argument("--keys", type=int, default=50, help="distinct keys the calls cycle over")
    parser.add_argument("--value-bytes", type=int, default=200, help="size of the text in the value")
    parser.add_argument("--json", action="store_true", help="also print the figures as one JSON line")
    add_bus_option(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    return asyncio.run(run(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
