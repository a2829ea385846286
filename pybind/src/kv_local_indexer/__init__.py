"""Compatibility module: ``from kv_local_indexer import LocalIndexer`` keeps working with kvshm installed.

The engine that imported the old in-process extension only changes what it installs: this module re-exports
:class:`kvshm.LocalIndexer`, which has the same constructor and methods (plus ``stats()`` and context-manager use).
"""

from kvshm import LocalIndexer

__all__ = ["LocalIndexer"]
