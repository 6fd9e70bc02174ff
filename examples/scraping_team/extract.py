"""Field extraction, pure: a tiny HTML parser, a tiny selector language, the field checks,
the team's candidate selectors and the discovery loop that counts its steps.

An *extraction step* is one selector tried on one page (:func:`select`). Discovering a
field's selector on a layout the agent knows nothing about tries the candidates of
:data:`CANDIDATES` in order until one gives a value its field check accepts; a pattern
recalled from memory is tried first, and costs one step when it still works.

Selectors (a small subset of CSS, enough for the example's shops)::

    tag            h1
    .class         .price            (any number of classes: span.price.now)
    #id            #product-name
    [attr=value]   [itemprop=price]  (several allowed)
    @attr          meta[itemprop=price]@content   (the attribute's value, not the text)

The first element (document order) that matches gives the value; its text is the
whitespace-normalised text of the element and its descendants.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from html.parser import HTMLParser

__all__ = [
    "CANDIDATES",
    "FIELDS",
    "Discovery",
    "Element",
    "Selector",
    "check",
    "discover",
    "normalise",
    "parse_html",
    "parse_selector",
    "select",
]

#: The product fields the team extracts.
FIELDS: tuple[str, ...] = ("name", "price", "sku")

#: The selectors the team's heuristics try, in order, on a layout they know nothing about.
CANDIDATES: Mapping[str, tuple[str, ...]] = {
    "name": ("h1.title", "h1.name", "h1#product-name", "h2.title", "[itemprop=name]", "div.product-name"),
    "price": ("span.price", "div.price", "div.cost", "span.amount", "meta[itemprop=price]@content", "span.now"),
    "sku": ("span.sku", "td[data-field=sku]", "small.code", "[itemprop=sku]", "div.sku"),
}

_VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track",
                   "wbr"})
_SPACES = re.compile(r"\s+")
_PRICE = re.compile(r"^(?:\$|USD\s*)?(\d{1,6}\.\d{2})(?:\s*USD)?$")
_SKU = re.compile(r"^[A-Z]{2,4}-\d{3,6}$")


@dataclass(slots=True)
class Element:
    """One element of a page: its tag, attributes and text (its descendants' text included)."""

    tag: str
    attrs: dict[str, str]
    parts: list[str] = field(default_factory=list)

    @property
    def classes(self) -> frozenset[str]:
        return frozenset(self.attrs.get("class", "").split())

    @property
    def text(self) -> str:
        return _SPACES.sub(" ", "".join(self.parts)).strip()


class _Collector(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[Element] = []
        self._open: list[Element] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(tag, {k: v or "" for k, v in attrs})
        self.elements.append(element)
        if tag not in _VOID:
            self._open.append(element)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append(Element(tag, {k: v or "" for k, v in attrs}))

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self._open) - 1, -1, -1):  # close up to the innermost open element of that tag
            if self._open[i].tag == tag:
                del self._open[i:]
                return

    def handle_data(self, data: str) -> None:
        for element in self._open:
            element.parts.append(data)


def parse_html(html: str) -> list[Element]:
    """The elements of ``html`` in document order (unclosed elements end with the document)."""
    collector = _Collector()
    collector.feed(html)
    collector.close()
    return collector.elements


_SELECTOR = re.compile(r"^(?P<tag>[a-z][a-z0-9]*)?(?P<rest>(?:[.#][\w-]+|\[[\w-]+=[^\]]*\])*)(?:@(?P<attr>[\w-]+))?$")
_PART = re.compile(r"\.(?P<cls>[\w-]+)|#(?P<id>[\w-]+)|\[(?P<name>[\w-]+)=(?P<value>[^\]]*)\]")


@dataclass(frozen=True, slots=True)
class Selector:
    """A parsed selector (:func:`parse_selector`)."""

    tag: str | None
    classes: frozenset[str]
    attrs: tuple[tuple[str, str], ...]
    attribute: str | None

    def matches(self, element: Element) -> bool:
        if self.tag is not None and element.tag != self.tag:
            return False
        if not self.classes <= element.classes:
            return False
        return all(element.attrs.get(name) == value for name, value in self.attrs)

    def value(self, element: Element) -> str:
        if self.attribute is not None:
            return element.attrs.get(self.attribute, "").strip()
        return element.text


def parse_selector(text: str) -> Selector:
    """Parse ``text`` (see the module's docstring).

    Raises:
        ValueError: not a selector of this language.
    """
    m = _SELECTOR.match(text.strip())
    if m is None or not (m["tag"] or m["rest"]):
        raise ValueError(f"not a selector: {text!r}")
    classes: set[str] = set()
    attrs: list[tuple[str, str]] = []
    for part in _PART.finditer(m["rest"]):
        if part["cls"]:
            classes.add(part["cls"])
        elif part["id"]:
            attrs.append(("id", part["id"]))
        else:
            attrs.append((part["name"], part["value"]))
    return Selector(m["tag"], frozenset(classes), tuple(attrs), m["attr"])


def select(elements: Sequence[Element], selector: str) -> str | None:
    """The value the first element matching ``selector`` gives (None: no element matches,
    or its value is empty)."""
    sel = parse_selector(selector)
    for element in elements:
        if sel.matches(element):
            return sel.value(element) or None
    return None


def _name(value: str) -> str | None:
    if not 3 <= len(value) <= 120 or _PRICE.match(value) or _SKU.match(value):
        return None
    return value


def _price(value: str) -> str | None:
    m = _PRICE.match(value)
    return m[1] if m else None


def _sku(value: str) -> str | None:
    return value if _SKU.match(value) else None


_CHECKS: Mapping[str, Callable[[str], str | None]] = {"name": _name, "price": _price, "sku": _sku}


def normalise(field_name: str, value: str | None) -> str | None:
    """``value`` as ``field_name``'s check accepts it (a price as ``"24.00"``), or None when
    the check refuses it (a name that looks like a price, a SKU not like ``AB-1234``).

    Raises:
        KeyError: not a field of :data:`FIELDS`.
    """
    check_field = _CHECKS[field_name]
    return None if value is None else check_field(value)


def check(elements: Sequence[Element], field_name: str, selector: str) -> str | None:
    """One extraction step: ``selector`` on the page, its value normalised (None: it fails)."""
    return normalise(field_name, select(elements, selector))


@dataclass(frozen=True, slots=True)
class Discovery:
    """What finding one field on one page took."""

    field: str
    #: The selector that worked (None: none did).
    selector: str | None
    value: str | None
    #: Selectors tried, in order (the extraction steps).
    tried: tuple[str, ...]
    #: The selector came from memory (the first one tried).
    recalled: bool = False

    @property
    def steps(self) -> int:
        return len(self.tried)


def discover(elements: Sequence[Element], field_name: str, known: Iterable[str] = ()) -> Discovery:
    """Find ``field_name`` on a page: the ``known`` selectors first (patterns recalled from
    memory, best first), then the candidates not tried yet, until one works."""
    tried: list[str] = []
    known = list(dict.fromkeys(known))
    for selector in [*known, *(c for c in CANDIDATES[field_name] if c not in known)]:
        tried.append(selector)
        value = check(elements, field_name, selector)
        if value is not None:
            return Discovery(field_name, selector, value, tuple(tried), recalled=selector in known)
    return Discovery(field_name, None, None, tuple(tried))
