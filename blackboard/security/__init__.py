"""Identities and access: policy, permissions, credentials, the authority (docs/security.md)."""
