"""kvshm: a worker's KV-cache event memory for LLM serving, in shared memory, served by kvshmd.

The engine publishes KV-cache events with :class:`LocalIndexer` (a drop-in replacement for the
``kv_local_indexer`` extension); a kvshmd daemon (shipped in the wheel and started privately by default) keeps the
radix tree and the recent-event log and answers Dynamo's recovery queries (``get_events_json``).

    >>> from kvshm import LocalIndexer
    >>> with LocalIndexer(worker_id=0, kv_block_size=4) as ix:           # doctest: +SKIP
    ...     ix.apply_stored(0, token_ids=list(range(8)), block_hashes=[11, 12])
    ...     print(ix.get_events_json(0))
"""

from . import events
from ._batch import ZmqPublish
from ._errors import ClosedError, ForkedProcessError, KvshmError, LauncherError
from ._indexer import LocalIndexer
from ._ring import RingError
from ._stats import BatchStats, IndexerStats, LostRange
from ._version import package_version

__all__ = [
    "BatchStats",
    "ClosedError",
    "ForkedProcessError",
    "IndexerStats",
    "KvshmError",
    "LauncherError",
    "LocalIndexer",
    "LostRange",
    "RingError",
    "ZmqPublish",
    "__version__",
    "events",
]

__version__: str = package_version()
