"""Search over what the worker stored: the engine, its pure fusion, and the search service.

Server side: runs in the worker next to PostgreSQL. Agents reach it through
the search micro service (``bb.search.*``).
"""
