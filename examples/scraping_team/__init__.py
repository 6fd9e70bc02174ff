"""The scraping team: three agents extract product fields from a small local site and share
the selectors they discover as long-term patterns (``agent.memory``), settle a conflicting
selector by vote, prune the outvoted pattern, and count the extraction steps memory saved.

Run it with ``python -m examples.scraping_team`` against ``blackboard dev``; see README.md.
No LLM key is needed.
"""

from examples.scraping_team.extract import (
    CANDIDATES,
    FIELDS,
    Discovery,
    discover,
    parse_html,
    select,
)
from examples.scraping_team.site import CATALOG, SHOPS, Product, SiteServer
from examples.scraping_team.team import (
    Scout,
    ScrapeConfig,
    ScrapeResult,
    run_baseline,
    run_scraping_team,
)

__all__ = [
    "CANDIDATES",
    "CATALOG",
    "FIELDS",
    "SHOPS",
    "Discovery",
    "Product",
    "Scout",
    "ScrapeConfig",
    "ScrapeResult",
    "SiteServer",
    "discover",
    "parse_html",
    "run_baseline",
    "run_scraping_team",
    "select",
]
