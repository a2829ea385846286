"""The topology checks can fail: a truth that misses one event, an endpoint that does not exist."""

from __future__ import annotations

import pytest
from kvshm_conf import topologies as T
from kvshm_conf.__main__ import kvshmd_path
from kvshm_conf.ops import Event, Stored
from kvshm_conf.rebuild import Follower
from kvshm_conf.report import Row


def test_a_truth_missing_one_event_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    real = T.deliver_truth
    dropped: list[int] = []

    def lossy(truth: dict[int, Follower], p: T.Producer, ev: Event, block_size: int) -> None:
        if p.worker_id == 11 and isinstance(ev, Stored) and ev.seq >= 10 and ev.parent is None:
            dropped.append(ev.seq)  # the truth never hears of worker 11's root chains from seq 10 on
            return
        real(truth, p, ev, block_size)

    monkeypatch.setattr(T, "deliver_truth", lossy)
    row = Row("shared")
    with T.topology("shared", kvshmd_path(), 3) as t:
        T.run_topology(t, 3, row, events=40)
    assert dropped
    assert any("differs from the truth" in f or "the truth holds" in f for f in row.failures), row.failures


def test_an_endpoint_that_answers_404_fails() -> None:
    row = Row("shared")
    with T.topology("shared", kvshmd_path(), 3) as t:
        t.endpoint = lambda w, r, s, e: [t.daemon.url(f"/nowhere?start={s}&end={e}")]
        T.run_topology(t, 3, row, events=20)
    assert any("-> 404" in f for f in row.failures), row.failures
