"""The commands for people: ``blackboard get / put / delete / ls / history / watch / search /
recall / remember / send / inbox / status`` (docs/cli.md), acting as an agent identity."""

from blackboard.apps.people.parsers import PEOPLE_COMMANDS, add_people_commands

__all__ = ["PEOPLE_COMMANDS", "add_people_commands"]
