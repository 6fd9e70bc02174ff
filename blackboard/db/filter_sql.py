"""The SQL of comparison filters (``where``, :mod:`blackboard.protocol.filters`): pure
``(sql, params)`` builders, no IO; :func:`blackboard.db.search_sql.filters` adds them to a
search's conditions.

Their semantics are :func:`blackboard.protocol.filters.matches`'s; ``tests/search/test_where_sql.py``
checks that the two agree on generated documents in PostgreSQL.
"""

from __future__ import annotations

import re
from typing import Any

from psycopg.types.json import Jsonb

from blackboard.protocol.filters import PathFilter

__all__ = ["where_conditions"]

#: A path segment PostgreSQL's ``#>`` may read as an array index (``strtol``'s syntax).
_INDEX_LIKE = re.compile(r"[ \t\n\v\f\r]*[+-]?[0-9]+")
#: Each operator's condition on ``{x}``, the jsonb at the path (``doc #> %s::text[]``), its
#: operand's ``%s`` after the path's (the ordered ones read the path twice: see _ordered).
_WHERE_SQL: dict[str, str] = {
    "$eq": "{x} = %s::jsonb",
    "$ne": "({x} IS NULL OR {x} <> %s::jsonb)",
    "$in": "{x} = ANY(%s::jsonb[])",
    "$nin": "({x} IS NULL OR {x} <> ALL(%s::jsonb[]))",
}
_ORDER_SQL = {"$gt": ">", "$gte": ">=", "$lt": "<", "$lte": "<="}


def where_conditions(alias: str, path: PathFilter) -> list[tuple[str, list[Any]]]:
    """The SQL conditions ``(text, params)`` of one path of a ``where`` on alias ``m`` or ``e``,
    with the semantics of :func:`blackboard.protocol.filters.matches`.

    The path goes as a ``text[]`` parameter (``#>``: a missing path is SQL NULL, a JSON null
    ``'null'``), so a statement's text depends only on the operators used. Ordered comparisons
    hold for the operand's JSON type only (``jsonb_typeof`` guards the cast inside a CASE:
    numbers as ``numeric``, exact as Python's int/float comparisons; strings under ``COLLATE
    "C"``: by code point, as UTF-8 bytes sort). A scalar ``$eq`` on a metadata path that cannot
    index an array is also written as containment (``metadata @> {...}``), which the
    ``jsonb_path_ops`` GIN index serves; it is implied by the equality, so it changes no result.
    """
    doc = f"{alias}.metadata" if path.root == "metadata" else f"{alias}.value"
    keys = list(path.keys)
    x = f"({doc} #> %s::text[])"
    out: list[tuple[str, list[Any]]] = []
    for c in path.conditions:
        op, operand = c.op, c.operand
        if op == "$exists":
            out.append((f"{x} IS {'NOT ' if operand else ''}NULL", [keys]))
        elif op in _ORDER_SQL:
            out.append(_ordered(doc, _ORDER_SQL[op], keys, operand))
        elif op in ("$in", "$nin"):
            out.append((_WHERE_SQL[op].format(x=x), [keys] * _WHERE_SQL[op].count("{x}")
                        + [[Jsonb(v) for v in operand]]))
        else:
            if (op == "$eq" and path.root == "metadata" and keys and not isinstance(operand, dict | list | tuple)
                    and not any(_INDEX_LIKE.fullmatch(k) for k in keys)):
                nested: Any = operand
                for k in reversed(keys):
                    nested = {k: nested}
                out.append((f"{doc} @> %s", [Jsonb(nested)]))
            out.append((_WHERE_SQL[op].format(x=x), [keys] * _WHERE_SQL[op].count("{x}") + [Jsonb(operand)]))
    return out


def _ordered(doc: str, op: str, keys: list[str], operand: int | float | str) -> tuple[str, list[Any]]:
    if isinstance(operand, str):
        return (f"CASE jsonb_typeof({doc} #> %s::text[]) WHEN 'string' THEN "
                f"({doc} #>> %s::text[]) COLLATE \"C\" {op} %s::text END", [keys, keys, operand])
    number = str(operand) if isinstance(operand, int) else repr(float(operand))
    return (f"CASE jsonb_typeof({doc} #> %s::text[]) WHEN 'number' THEN "
            f"({doc} #> %s::text[])::numeric {op} %s::numeric END", [keys, keys, number])
