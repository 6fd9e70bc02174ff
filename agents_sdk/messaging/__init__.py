"""Agent messages: direct, broadcast and topic sends, durable inboxes, request/reply."""
