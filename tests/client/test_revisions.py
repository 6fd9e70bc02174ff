"""The revisions a board store remembers per key (read-your-writes), pure."""

from __future__ import annotations

from blackboard.client.revisions import SeenRevisions


def test_only_a_newer_revision_is_remembered() -> None:
    seen = SeenRevisions()
    assert seen.saw("a", 5)
    assert not seen.saw("a", 3)
    assert not seen.saw("a", 5)
    assert seen.revisions["a"] == 5
    seen.wrote("a", 4, expires_at=10.0)  # older: changes nothing
    assert seen.revisions["a"] == 5 and not seen.expired("a", 11.0)


def test_the_oldest_subjects_go_first_past_the_limit() -> None:
    seen = SeenRevisions(limit=3)
    for n, subject in enumerate("abcd", 1):
        seen.wrote(subject, n, expires_at=100.0)
    assert list(seen.revisions) == ["b", "c", "d"]
    assert len(seen) == 3
    assert not seen.expired("a", 200.0)


def test_an_expiring_write_is_held_until_its_ttl_ran_out_and_a_later_write_holds_again() -> None:
    seen = SeenRevisions()
    seen.wrote("k", 7, expires_at=10.0)
    assert not seen.expired("k", 9.9)
    assert seen.expired("k", 10.0)
    seen.saw("k", 8)  # a later revision (no TTL): insisted on for good
    assert not seen.expired("k", 11.0)
    seen.forget("k")
    assert "k" not in seen.revisions
