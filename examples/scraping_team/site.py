"""The example's website: three small shops with a layout each, served from memory on
127.0.0.1 by :class:`SiteServer` (the standard library's HTTP server in a thread).

* ``/`` lists the shops; ``/<shop>/`` lists its product pages; ``/<shop>/p<n>.html`` is
  one product page.
* ``shop-a`` (Alder Outfitters): ``h2.title``, ``span.amount``, ``small.code``.
* ``shop-b`` (Birch & Co): ``h1#product-name``, ``div.cost`` ("19.50 USD"), a spec table
  (``td[data-field=sku]``).
* ``shop-c`` (Cedar Market): ``h1.name``, microdata (``meta[itemprop=price]``,
  ``span[itemprop=sku]``); a regular price is also shown as ``span.price``, but a product
  on sale shows the old price struck through and the new one as ``span.now``: a selector
  learnt on a regular page (``span.price``) fails on a sale page.

:data:`CATALOG` is the ground truth the example checks the extraction against.
"""

from __future__ import annotations

import html
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType

__all__ = ["CATALOG", "SHOPS", "Product", "SiteServer", "page_paths", "render"]


@dataclass(frozen=True, slots=True)
class Product:
    """One product as the shop sells it (the ground truth)."""

    shop: str
    n: int
    name: str
    price: str
    sku: str
    #: On sale: ``price`` is the sale price, ``was`` the old one.
    was: str | None = None

    @property
    def path(self) -> str:
        return f"/{self.shop}/p{self.n}.html"

    def fields(self) -> dict[str, str]:
        return {"name": self.name, "price": self.price, "sku": self.sku}


#: Shop id -> its display name.
SHOPS: Mapping[str, str] = {"shop-a": "Alder Outfitters", "shop-b": "Birch & Co", "shop-c": "Cedar Market"}

CATALOG: tuple[Product, ...] = (
    Product("shop-a", 1, "Trail Lantern", "24.00", "AL-1001"),
    Product("shop-a", 2, "Folding Camp Stool", "18.50", "AL-1002"),
    Product("shop-a", 3, "Wool Hiking Socks", "12.00", "AL-1003"),
    Product("shop-a", 4, "Enamel Mug", "9.75", "AL-1004"),
    Product("shop-b", 1, "Oak Cutting Board", "32.00", "BR-2001"),
    Product("shop-b", 2, "Linen Tea Towel", "11.25", "BR-2002"),
    Product("shop-b", 3, "Cast Iron Skillet", "45.00", "BR-2003"),
    Product("shop-b", 4, "Beeswax Wraps", "14.90", "BR-2004"),
    Product("shop-c", 1, "Desk Lamp", "39.00", "CM-3001"),
    Product("shop-c", 2, "Walnut Bookends", "24.00", "CM-3002", was="30.00"),
    Product("shop-c", 3, "Ceramic Planter", "21.00", "CM-3003"),
    Product("shop-c", 4, "Brass Letter Opener", "16.00", "CM-3004", was="20.00"),
)


def _shop_a(p: Product) -> str:
    return (f'<header><a href="/">{html.escape(SHOPS[p.shop])}</a></header>\n'
            f'<div class="product">\n  <h2 class="title">{html.escape(p.name)}</h2>\n'
            f'  <p>Price: <span class="amount">${p.price}</span></p>\n'
            f'  <p>Item <small class="code">{p.sku}</small></p>\n</div>')


def _shop_b(p: Product) -> str:
    return (f'<nav><h2>{html.escape(SHOPS[p.shop])}</h2></nav>\n<article>\n'
            f'  <h1 id="product-name">{html.escape(p.name)}</h1>\n  <div class="cost">{p.price} USD</div>\n'
            f'  <table class="spec"><tr><th>SKU</th><td data-field="sku">{p.sku}</td></tr>\n'
            f'  <tr><th>Ships</th><td data-field="ships">in 2 days</td></tr></table>\n</article>')


def _shop_c(p: Product) -> str:
    price = (f'<del class="was">${p.was}</del> <span class="now">${p.price}</span>' if p.was
             else f'<span class="price">${p.price}</span>')
    return (f'<div class="brand">{html.escape(SHOPS[p.shop])}</div>\n'
            f'<main itemscope itemtype="https://schema.org/Product">\n'
            f'  <h1 class="name" itemprop="name">{html.escape(p.name)}</h1>\n'
            f'  <meta itemprop="price" content="{p.price}"><meta itemprop="priceCurrency" content="USD">\n'
            f'  <p class="offer">{price}</p>\n  <p>Ref. <span itemprop="sku">{p.sku}</span></p>\n</main>')


_LAYOUTS = {"shop-a": _shop_a, "shop-b": _shop_b, "shop-c": _shop_c}


def _document(title: str, body: str) -> str:
    return (f'<!doctype html>\n<html><head><meta charset="utf-8"><title>{html.escape(title)}</title></head>\n'
            f'<body>\n{body}\n</body></html>\n')


def page_paths(shop: str | None = None) -> list[str]:
    """The product pages' paths (of one shop), in catalog order."""
    return [p.path for p in CATALOG if shop is None or p.shop == shop]


def render(path: str) -> str | None:
    """The page at ``path`` (None: no such page)."""
    if path in ("/", "/index.html"):
        links = "\n".join(f'<li><a href="/{s}/">{html.escape(n)}</a></li>' for s, n in SHOPS.items())
        return _document("Shops", f"<ul>\n{links}\n</ul>")
    for shop, name in SHOPS.items():
        if path in (f"/{shop}/", f"/{shop}/index.html"):
            links = "\n".join(f'<li><a href="{p.path}">{html.escape(p.name)}</a></li>'
                              for p in CATALOG if p.shop == shop)
            return _document(name, f"<ul class=\"products\">\n{links}\n</ul>")
    for product in CATALOG:
        if path == product.path:
            return _document(f"{product.name} - {SHOPS[product.shop]}", _LAYOUTS[product.shop](product))
    return None


class _Handler(BaseHTTPRequestHandler):
    server_version = "ScrapingTeamSite/1"

    def do_GET(self) -> None:
        page = render(self.path.split("?", 1)[0])
        body = (page or "not found\n").encode()
        self.send_response(200 if page is not None else 404)
        self.send_header("Content-Type", "text/html; charset=utf-8" if page is not None else "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # quiet: the example prints its own transcript
        return


class SiteServer:
    """The shops on ``http://127.0.0.1:<free port>``, in a background thread.

    ``with SiteServer() as site: site.url("/shop-a/p1.html")``.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._httpd = ThreadingHTTPServer((host, port), _Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="scraping-site", daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def url(self, path: str) -> str:
        return self.base_url + path

    def __enter__(self) -> SiteServer:
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)
