"""``BlackboardStore`` for the tests, imported even before the package's checkpointer exists.

``agents_sdk.langgraph`` re-exports the store and the checkpointer; while the latter is being
written the package cannot be imported, so the store module is loaded under a bare package.
"""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path

try:
    from agents_sdk.langgraph import BlackboardStore
except ImportError:  # pragma: no cover - only until agents_sdk/langgraph/checkpoint.py exists
    import agents_sdk

    sys.modules.pop("agents_sdk.langgraph", None)
    pkg = types.ModuleType("agents_sdk.langgraph")
    pkg.__path__ = [str(Path(agents_sdk.__file__).parent / "langgraph")]
    sys.modules["agents_sdk.langgraph"] = pkg
    BlackboardStore = importlib.import_module("agents_sdk.langgraph.store").BlackboardStore  # type: ignore[misc]

__all__ = ["BlackboardStore"]
