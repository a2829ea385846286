"""The stream generator: deterministic, and covering what it promises (against the real reference)."""

from __future__ import annotations

import json

from kvshm_conf.differential import feed
from kvshm_conf.gen import PROFILES, Profile, generate
from kvshm_conf.ops import Query, Stored

import kvshm_conformance as ref


def test_deterministic() -> None:
    for p in PROFILES:
        assert generate(p, 7).ops == generate(p, 7).ops
    assert generate(PROFILES[0], 7).ops != generate(PROFILES[0], 8).ops


def test_seqs_increase_and_skip_only_when_asked() -> None:
    for p in PROFILES:
        seqs = [op.seq for op in generate(p, 3).ops if not isinstance(op, Query)]
        assert seqs == sorted(set(seqs)), p.name
        gaps = any(b - a > 1 for a, b in zip(seqs, seqs[1:]))
        assert gaps == p.skips, p.name


def test_mismatch_profile_has_token_mismatches() -> None:
    p = Profile("m", mismatch=True, events=300)
    odd = [
        op
        for op in generate(p, 1).ops
        if isinstance(op, Stored) and len(op.tokens) != len(op.hashes) * p.block_size + (1 if op.is_eagle else 0)
    ]
    assert odd


def test_marks_only_where_the_pattern_is() -> None:
    for p in PROFILES:
        marks = generate(p, 5).marks
        if not p.dup_parent:
            assert "D2" not in marks, p.name
        if p.cleared_single_rank_only:
            assert "D1" not in marks, p.name


def test_queries_reach_every_outcome() -> None:
    seen: set[str] = set()
    for p in PROFILES:
        ix = ref.LocalIndexer(p.worker_id, p.block_size, p.max_buffer_size)
        for op in generate(p, 11).ops:
            if isinstance(op, Query):
                seen.add(next(iter(json.loads(ix.get_events_json(op.start, op.end)))))
            else:
                assert feed(ix, op) is None
        ix.shutdown()
    assert {"Events", "TreeDump", "TooNew", "InvalidRange"} <= seen
