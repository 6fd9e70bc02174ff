"""What the commands for people share: their settings, the agent they act as, how input is
read and how a failure becomes one line and an exit code (docs/cli.md, "Exit codes").
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any, TextIO

import nats.errors
from pydantic import ValidationError

from agents_sdk import Agent
from blackboard.protocol.errors import (
    AuthenticationError,
    BlackboardError,
    ConfigurationError,
    ConflictError,
    InvalidKeyError,
    InvalidPayloadError,
    NotFoundError,
    PermissionDeniedError,
    ProposalNotFoundError,
)
from blackboard.protocol.subjects import validate_name
from blackboard.security.credentials import credential_kind, load_credentials_file
from blackboard.settings import Settings, describe_errors

__all__ = [
    "EXIT_AUTH",
    "EXIT_CONFLICT",
    "EXIT_DENIED",
    "EXIT_FAILED",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_USAGE",
    "acting_agent",
    "connect_agent",
    "exit_code",
    "json_object",
    "load_settings",
    "read_value",
    "run_command",
]

#: Done.
EXIT_OK = 0
#: Anything else went wrong: no server, no worker for a search, a timeout.
EXIT_FAILED = 1
#: The command line or the settings are wrong: an argument, malformed JSON, an invalid name.
EXIT_USAGE = 2
#: The key, revision or board does not exist.
EXIT_NOT_FOUND = 3
#: ``--expect-revision`` did not hold: another write came first.
EXIT_CONFLICT = 4
#: The identity's rights do not allow it (the server or the system service refused).
EXIT_DENIED = 5
#: No credential for the identity, or the server refused it.
EXIT_AUTH = 6


def exit_code(exc: BaseException) -> int:
    """The exit code of a command that failed with ``exc``."""
    if isinstance(exc, ConflictError):
        return EXIT_CONFLICT
    if isinstance(exc, (NotFoundError, ProposalNotFoundError)):
        return EXIT_NOT_FOUND
    if isinstance(exc, PermissionDeniedError):
        return EXIT_DENIED
    if isinstance(exc, AuthenticationError):
        return EXIT_AUTH
    if isinstance(exc, (ConfigurationError, InvalidKeyError, InvalidPayloadError)):
        return EXIT_USAGE
    return EXIT_FAILED


#: What a command may fail with that is told as one line: ours, and what the transport or the
#: file system raise past the SDK's wrapping.
_TOLD: tuple[type[BaseException], ...] = (BlackboardError, nats.errors.Error, OSError, TimeoutError)


async def run_command(args: argparse.Namespace, fn: Callable[[argparse.Namespace], Awaitable[int]]) -> int:
    """Run one command; a failure is one line on stderr (``blackboard <command>: error: ...``)
    and its exit code (:func:`exit_code`), never a traceback. Output to a pipe whose reader
    has gone (``| head``) ends the command quietly (exit 0)."""
    try:
        return await fn(args)
    except BrokenPipeError:  # the reader went away (``| head``): stop quietly, as a filter does
        _silence_stdout()
        return EXIT_OK
    except _TOLD as exc:
        text = " ".join(str(exc).split()) or type(exc).__name__
        print(f"blackboard {args.command}: error: {text}", file=sys.stderr, flush=True)
        return exit_code(exc)


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that flushing it at exit raises no BrokenPipeError again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, io.UnsupportedOperation):  # no file descriptor (a captured stdout)
        pass


def load_settings(args: argparse.Namespace) -> Settings:
    """The environment's settings (``BLACKBOARD_*``) with ``--nats-url`` (and ``--postgres-dsn``)
    over them.

    Raises:
        ConfigurationError: a setting is invalid (each named, with its variable).
    """
    given: dict[str, Any] = {}
    if getattr(args, "nats_url", None):
        given["nats"] = {"url": args.nats_url}
    if getattr(args, "postgres_dsn", None):
        given["postgres"] = {"dsn": args.postgres_dsn}
    try:
        return Settings(**given)
    except ValidationError as exc:
        raise ConfigurationError(describe_errors(exc)) from exc


def acting_agent(args: argparse.Namespace, settings: Settings) -> str:
    """The agent id the command acts as: ``--as``, else ``cli.agent`` (``BLACKBOARD_CLI__AGENT``),
    else the agent whose credential ``nats.creds_file`` holds.

    Raises:
        InvalidKeyError: the id is not a valid agent id.
        AuthenticationError: ``nats.creds_file`` cannot be read.
        ConfigurationError: none of the three names an agent.
    """
    name = getattr(args, "as_agent", None) or settings.cli.agent
    if name:
        return validate_name(name, "agent id")
    creds_file = settings.nats.creds_file
    if creds_file is not None:
        found = load_credentials_file(creds_file, f"nats.creds_file ({creds_file})")
        if credential_kind(found.credentials) in ("agent", None):
            return found.principal
    raise ConfigurationError("no agent to act as: give --as NAME, or set BLACKBOARD_CLI__AGENT "
                             "(cli.agent), or point BLACKBOARD_NATS__CREDS_FILE at an agent's credential")


def connect_agent(args: argparse.Namespace) -> AbstractAsyncContextManager[Agent]:
    """``Agent.connect`` as the acting agent (:func:`acting_agent`) with the command's settings;
    use as ``async with connect_agent(args) as agent``.

    Raises:
        ConfigurationError, InvalidKeyError: see :func:`load_settings`, :func:`acting_agent`.
        AuthenticationError, NotConnectedError: see ``Agent.connect`` (on entering).
    """
    settings = load_settings(args)
    return Agent.connect(acting_agent(args, settings), settings=settings)


def read_value(text: str, *, what: str, plain: bool = False, stdin: TextIO | None = None) -> Any:
    """A value given on the command line: ``-`` reads it from stdin; JSON text is its JSON value,
    anything else (or everything, with ``plain``) the string itself.

    Raises:
        InvalidPayloadError: stdin cannot be read as text.
    """
    if text == "-":
        try:
            text = (stdin or sys.stdin).read()
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidPayloadError(f"{what}: cannot read stdin: {exc}") from exc
        if not plain:
            text = text.strip()
    if plain:
        return text
    try:
        return json.loads(text, parse_constant=_no_constant)
    except ValueError:  # not JSON (a RecursionError of deep JSON is refused by the SDK's limits first)
        return text


def json_object(text: str | None, *, what: str) -> dict[str, Any] | None:
    """A JSON object given with a flag (``--metadata``, ``--where``); None when not given.

    Raises:
        InvalidPayloadError: not JSON, or JSON that is not an object.
    """
    if text is None:
        return None
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise InvalidPayloadError(f"{what} is not valid JSON: {exc}") from None
    if not isinstance(value, Mapping):
        raise InvalidPayloadError(f"{what} must be a JSON object, not {type(value).__name__}: {text[:60]!r}")
    return dict(value)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")
