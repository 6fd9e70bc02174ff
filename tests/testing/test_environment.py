"""settings_env gives another process the same settings."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import SecretStr

from blackboard.settings import Settings
from blackboard.testing import settings_env


def test_defaults_give_no_variables() -> None:
    assert settings_env(Settings.model_construct()) == {}


def test_changed_fields_round_trip(monkeypatch: pytest.MonkeyPatch) -> None:
    base = Settings.model_construct()
    settings = base.model_copy(update={
        "nats": base.nats.model_copy(update={"url": "tls://a:1,tls://b:2", "creds_file": Path("/x/w.creds"),
                                             "write_timeout": 12.5}),
        "postgres": base.postgres.model_copy(update={"dsn": SecretStr("postgresql://u:p@h/db")}),
        "worker": base.worker.model_copy(update={"embed": False}),
        "security": base.security.model_copy(update={"trusted_accounts": ["A" + "B" * 55]}),
    })
    env = settings_env(settings)
    assert env["BLACKBOARD_POSTGRES__DSN"] == "postgresql://u:p@h/db"  # the secret itself
    assert env["BLACKBOARD_WORKER__EMBED"] == "false"
    for name in list(os.environ):
        if name.startswith("BLACKBOARD_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    again = Settings()
    assert again.nats.url == "tls://a:1,tls://b:2"
    assert again.nats.creds_file == Path("/x/w.creds")
    assert again.nats.write_timeout == 12.5
    assert again.postgres.dsn.get_secret_value() == "postgresql://u:p@h/db"
    assert again.worker.embed is False
    assert again.security.trusted_accounts == ["A" + "B" * 55]
