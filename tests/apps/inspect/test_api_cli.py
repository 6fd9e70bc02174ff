"""``blackboard inspect``: serves the API as the identity it is given, until SIGINT; bad usage."""

from __future__ import annotations

import asyncio
import signal
import sys

import httpx2
import pytest

from blackboard.apps.cli import main
from blackboard.settings import Settings
from tests.apps.mcp.conftest import REPO, blackboard_env


@pytest.mark.asyncio
async def test_blackboard_inspect_serves_as_the_identity_until_interrupted(settings: Settings, unique: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "blackboard", "inspect", "--as", f"member-{unique}", "--port", "0", "--no-warm",
        cwd=REPO, env=blackboard_env(settings), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        assert line.startswith("blackboard inspect: http://127.0.0.1:"), line
        url = line.split()[2]
        async with httpx2.AsyncClient(timeout=30) as client:
            response = await client.get(url + "api/whoami")
            assert response.json() == {"agent": f"member-{unique}", "read_only": True}
        proc.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def test_bad_usage_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["inspect", "--port", "70000"])
    assert exited.value.code == 2
    assert "--port" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main(["inspect", "--help"])
    assert exited.value.code == 0
    assert "read-only" in capsys.readouterr().out
    assert main(["inspect", "--as", "not a name!"]) == 2
    assert "agent id" in capsys.readouterr().err
