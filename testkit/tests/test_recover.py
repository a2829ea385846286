from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kvshm import LocalIndexer
from kvshm_testkit import Kvshmd, http_get, serve_kv_recover


@pytest.fixture
def indexer(kvshmd_bin: Path, tmp_path: Path) -> Iterator[LocalIndexer]:
    with Kvshmd(kvshmd_bin, tmp_path, http=None) as d, LocalIndexer(7, 4, socket_path=str(d.socket)) as ix:
        yield ix


def test_serve_kv_recover_answers_what_the_index_answers(indexer: LocalIndexer) -> None:
    indexer.apply_stored(0, list(range(8)), [11, 12])
    indexer.apply_stored(1, list(range(8, 12)), [13], 12)
    srv = serve_kv_recover(indexer)
    try:
        base = f"http://127.0.0.1:{srv.server_address[1]}"
        for query, start, end in (("", None, None), ("?start=0", 0, None), ("?start=1&end=1", 1, 1)):
            r = http_get(base + "/kv_recover" + query)
            assert r.status == 200 and r.headers["content-type"] == "application/json"
            assert r.text == indexer.get_events_json(start, end)
        assert http_get(base + "/other").status == 404
    finally:
        srv.shutdown()
        srv.server_close()
