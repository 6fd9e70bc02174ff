"""Rights of principals as the system service sees them: from the policy file, or open.

The search service and the inbox administration read the principal from a
request's subject (the server's permissions let only that principal publish
there) and ask a :class:`RightsSource` what it may do. The policy file is
read again when it changes (checked at most once a second), so granting a
board does not need a restart.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from blackboard.protocol.errors import ConfigurationError
from blackboard.security.policy import OPEN_RIGHTS, AccessPolicy, Rights
from blackboard.settings import Settings

__all__ = ["RightsSource"]

log = logging.getLogger("blackboard.security.source")

_CHECK_EVERY = 1.0


class RightsSource:
    """``rights(principal)``: from a policy file (re-read on change), or everything (open bus)."""

    def __init__(self, policy_file: Path | None, *, open_bus: bool = False) -> None:
        if policy_file is None and not open_bus:
            raise ConfigurationError(
                "no access policy: set security.policy_file (BLACKBOARD_SECURITY__POLICY_FILE) "
                "or, for a dev bus without authorization only, nats.insecure_open_bus")
        self.policy_file = policy_file
        self.open_bus = open_bus
        self._policy: AccessPolicy | None = None
        self._mtime: float | None = None
        self._checked = 0.0
        if policy_file is not None:
            self._reload()

    @classmethod
    def from_settings(cls, settings: Settings) -> RightsSource:
        """The policy of ``security.policy_file`` (or ``<authority dir>/policy.toml`` when it
        exists); open rights for everyone when ``nats.insecure_open_bus`` is set and no policy is."""
        policy_file = settings.security.policy_file
        if policy_file is None:
            default = (settings.security.authority_dir or settings.dev.data_dir / "auth") / "policy.toml"
            if default.exists() and not settings.nats.insecure_open_bus:
                policy_file = default
        if settings.nats.insecure_open_bus and settings.security.policy_file is None:
            return cls(None, open_bus=True)
        return cls(policy_file, open_bus=settings.nats.insecure_open_bus)

    def _reload(self) -> None:
        assert self.policy_file is not None
        try:
            mtime = self.policy_file.stat().st_mtime
        except OSError as exc:
            if self._policy is None:
                raise ConfigurationError(f"cannot read the access policy {self.policy_file}: {exc}") from None
            log.warning("cannot stat the access policy %s (%s); keeping the last one read", self.policy_file, exc)
            return
        if mtime != self._mtime:
            try:
                self._policy = AccessPolicy.load(self.policy_file)
            except ConfigurationError as exc:
                if self._policy is None:
                    raise
                # Said once per change of the file (not at every look, once a second).
                log.error("the access policy is invalid; keeping the last one read: %s", exc)
                self._mtime = mtime
                return
            self._mtime = mtime

    def rights(self, principal: str) -> Rights | None:
        """The principal's rights; None when the policy does not declare it."""
        if self.policy_file is None:
            return OPEN_RIGHTS(principal)
        now = time.monotonic()
        if now - self._checked >= _CHECK_EVERY:
            self._checked = now
            self._reload()
        assert self._policy is not None
        return self._policy.rights(principal)
