"""The NATS permissions of a principal, derived from its rights (pure).

The server enforces these (they are written into each identity's user JWT),
so they are the real access control; docs/security.md lists them and why each
is needed. An agent gets an allow list and nothing else: no JetStream stream
or consumer administration (its durable inbox is created by the system
service, which checks its filters), no subscription beyond its own reply
inbox, its own request subject, its own direct messages and what it may read.
"""

from __future__ import annotations

from dataclasses import dataclass

from blackboard.protocol.subjects import Grants
from blackboard.security.policy import ALL_BOARDS, Right, Rights

__all__ = ["Permissions", "permissions_for"]


@dataclass(frozen=True, slots=True)
class Permissions:
    """Allow lists (publish, subscribe) and whether replies to received requests are allowed."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    responses: bool = True


def _boards(rights: Rights, right: Right) -> list[str]:
    boards = rights.boards(right)
    return [ALL_BOARDS] if boards is None else sorted(boards)


def permissions_for(rights: Rights, grants: Grants, public_key: str | None = None) -> Permissions:
    """What the server allows ``rights.principal`` to publish and subscribe to.

    ``public_key``: the user key the permissions are issued with; its holder may publish
    that key's certificate (``bb.keys.cert.<public key>``) and no other. Every identity
    may read the key registry and follow its revocations (docs/security.md, "Signatures").
    """
    if rights.system:
        return Permissions((Grants.everything(),), (Grants.everything(),))
    me = rights.principal
    pub: list[str] = [Grants.account_info(), Grants.direct_messages("*"), Grants.rpc("*"),
                      Grants.search(me), Grants.inbox_admin(me), *Grants.inbox_api(me), *Grants.key_reads()]
    if public_key is not None:
        pub.append(Grants.own_certificate(public_key))
    sub: list[str] = [Grants.replies(me), Grants.rpc(me), Grants.direct_messages(me), Grants.key_revocations()]
    for topic in rights.topics:
        pub.append(Grants.topics(topic))
        sub.append(Grants.topics(topic))
    for board in _boards(rights, Right.READ):
        pub += [grants.entry_get(board), grants.entry_consumer(board), grants.vote_get(board),
                grants.vote_consumer(board), *Grants.memory_reads(board)]
        sub += [Grants.broadcasts(board), Grants.votes(board)]
    for board in _boards(rights, Right.WRITE):
        pub += [grants.entries(board), Grants.memories(board, me), Grants.broadcasts(board)]
    for board in _boards(rights, Right.VOTE):
        pub += [Grants.proposals(board), Grants.ballots(board, me)]
    if rights.objects in ("read", "write"):
        pub += grants.objects()
    if rights.objects == "write":
        pub += grants.object_writes()
    return Permissions(tuple(dict.fromkeys(pub)), tuple(dict.fromkeys(sub)))
