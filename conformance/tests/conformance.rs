//! Tests of the conversion (trace), the reference (1.6.1's LocalKvIndexer), the consumer
//! (Events / TreeDump / no-op paths, canonical state) and parse_response (both shapes).
//! Hash vectors are the ones of /work/shared/reference/dynamo-local-indexer.md §2, computed
//! independently with libxxhash.

use dynamo_kv_router::indexer::WorkerKvQueryResponse;
use dynamo_kv_router::protocols::{KvCacheEventData, RouterEvent};
use kvshm_conformance::Error;
use kvshm_conformance::consumer::Consumer;
use kvshm_conformance::reference::Reference;
use kvshm_conformance::trace::{self, Hash, Op, StoredInput};
use kvshm_conformance::wire;

fn input<'a>(block_size: u32, tokens: &'a [u32], hashes: &'a [u64]) -> StoredInput<'a> {
    StoredInput {
        block_size,
        tokens,
        hashes,
        parent: None,
        lora_name: None,
        is_eagle: None,
    }
}

fn pairs(input: &StoredInput<'_>) -> Vec<(u64, u64)> {
    trace::stored_blocks(input)
        .iter()
        .map(|b| (b.block_hash.0, b.tokens_hash.0))
        .collect()
}

// ---------------------------------------------------------------- conversion

#[test]
fn tokens_hash_matches_independent_vectors() {
    let t16: Vec<u32> = (0..16).collect();
    let t32: Vec<u32> = (0..32).collect();
    let t4: Vec<u32> = (0..4).collect();
    let cases: Vec<(&str, StoredInput<'_>, u64)> = vec![
        (
            "tokens 0..15 bs 16",
            input(16, &t16, &[1]),
            15310707395893867146,
        ),
        (
            "tokens 0..31 bs 32",
            input(32, &t32, &[1]),
            5756925433886871916,
        ),
        ("tokens 0..3 bs 4", input(4, &t4, &[1]), 9143094415614847814),
        (
            "lora my-adapter",
            StoredInput {
                lora_name: Some("my-adapter"),
                ..input(4, &t4, &[1])
            },
            13692202469334984872,
        ),
        (
            "empty lora name is no lora",
            StoredInput {
                lora_name: Some(""),
                ..input(4, &t4, &[1])
            },
            9143094415614847814,
        ),
        (
            "eagle bs 2 tokens [0,1,2]",
            StoredInput {
                is_eagle: Some(true),
                ..input(2, &[0, 1, 2], &[1])
            },
            11646242937812223497,
        ),
    ];
    for (name, inp, want) in cases {
        assert_eq!(pairs(&inp), vec![(1, want)], "{name}");
    }
}

#[test]
fn blocks_are_zipped_the_shorter_list_decides() {
    let t: Vec<u32> = (0..10).collect();
    // (block_size, tokens, hashes, is_eagle) -> number of blocks
    type Case<'a> = (&'a str, u32, &'a [u32], &'a [u64], Option<bool>, usize);
    let cases: Vec<Case<'_>> = vec![
        ("exact", 2, &t[..6], &[1, 2, 3], None, 3),
        ("more hashes than windows", 2, &t[..4], &[1, 2, 3], None, 2),
        (
            "partial last window dropped",
            2,
            &t[..5],
            &[1, 2, 3],
            None,
            2,
        ),
        ("more tokens than hashes", 2, &t[..10], &[1, 2], None, 2),
        ("too few tokens for one window", 4, &t[..3], &[1], None, 0),
        ("no tokens", 2, &[], &[1, 2], None, 0),
        (
            "eagle needs one extra token",
            2,
            &t[..6],
            &[1, 2, 3],
            Some(true),
            2,
        ),
        ("eagle exact", 2, &t[..7], &[1, 2, 3], Some(true), 3),
        (
            "eagle false is plain",
            2,
            &t[..6],
            &[1, 2, 3],
            Some(false),
            3,
        ),
    ];
    for (name, bs, tokens, hashes, is_eagle, want) in cases {
        let inp = StoredInput {
            is_eagle,
            ..input(bs, tokens, hashes)
        };
        let got = pairs(&inp);
        assert_eq!(got.len(), want, "{name}: {got:?}");
        // the engine hashes keep their order
        let hs: Vec<u64> = got.iter().map(|p| p.0).collect();
        assert_eq!(hs, hashes[..want].to_vec(), "{name}");
    }
    // a block's tokens hash depends only on its own window
    let whole = pairs(&input(2, &t[..6], &[1, 2, 3]));
    let second = pairs(&input(2, &t[2..4], &[2]));
    assert_eq!(whole[1], second[0]);
}

#[test]
fn trace_ops_parse_and_convert() {
    let op = Op::parse(
        r#"{"op":"stored","seq":5,"dp_rank":2,"tokens":[0,1,2,3],"hashes":[-1,7],"parent":-2,"lora_name":null,"is_eagle":null}"#,
    )
    .unwrap();
    let ev = op.event(9, 2).unwrap();
    assert_eq!(
        (ev.worker_id, ev.event.event_id, ev.event.dp_rank),
        (9, 5, 2)
    );
    let KvCacheEventData::Stored(s) = &ev.event.data else {
        panic!("not stored: {ev:?}")
    };
    assert_eq!(s.parent_hash.map(|h| h.0), Some(u64::MAX - 1));
    assert_eq!(s.blocks[0].block_hash.0, u64::MAX);
    assert_eq!(s.blocks[1].block_hash.0, 7);

    // defaults: dp_rank 0, parent/lora/eagle absent
    let op = Op::parse(r#"{"op":"removed","seq":6,"hashes":[18446744073709551615]}"#).unwrap();
    assert_eq!(
        op,
        Op::Removed {
            seq: 6,
            dp_rank: 0,
            hashes: vec![Hash(u64::MAX)]
        }
    );
    let ev = Op::parse(r#"{"op":"cleared","seq":7,"dp_rank":1}"#)
        .unwrap()
        .event(3, 4)
        .unwrap();
    assert!(matches!(ev.event.data, KvCacheEventData::Cleared));
    assert!(
        Op::parse(r#"{"op":"query","start":null,"end":3}"#)
            .unwrap()
            .event(3, 4)
            .is_none()
    );

    for bad in [
        r#"{"op":"evicted","seq":1}"#,
        r#"{"op":"removed","seq":-1,"hashes":[]}"#,
        r#"{"op":"removed","seq":1,"hashes":[18446744073709551616]}"#,
        r#"{"op":"stored","seq":1,"hashes":[]}"#,
        "not json",
    ] {
        assert!(matches!(Op::parse(bad), Err(Error::BadOp(_))), "{bad}");
    }
}

// ---------------------------------------------------------------- reference

fn stored(seq: u64, tokens: &[u32], hashes: &[u64], parent: Option<u64>) -> RouterEvent {
    trace::stored_event(
        7,
        seq,
        0,
        &StoredInput {
            parent,
            ..input(2, tokens, hashes)
        },
    )
}

fn ids(resp: &WorkerKvQueryResponse) -> Vec<u64> {
    match resp {
        WorkerKvQueryResponse::Events { events, .. } => {
            events.iter().map(|e| e.event.event_id).collect()
        }
        other => panic!("not Events: {other:?}"),
    }
}

#[test]
fn reference_answers_like_upstream_range_tests() {
    let r = Reference::new(7, 2, 5).unwrap();
    for seq in 5..15u64 {
        r.apply(stored(seq, &[seq as u32, 0], &[1000 + seq], None))
            .unwrap();
    }
    assert_eq!(ids(&r.query(Some(11), None)), vec![11, 12, 13, 14]);
    assert_eq!(ids(&r.query(Some(10), Some(14))), vec![10, 11, 12, 13, 14]);
    assert_eq!(ids(&r.query(Some(11), Some(12))), vec![11, 12, 13, 14]);
    match r.query(None, None) {
        WorkerKvQueryResponse::TreeDump {
            events,
            last_event_id,
            ..
        } => {
            assert_eq!(last_event_id, 14);
            assert_eq!(events.len(), 10, "ten root blocks");
        }
        other => panic!("want TreeDump: {other:?}"),
    }
    assert!(matches!(
        r.query(Some(7), None),
        WorkerKvQueryResponse::TreeDump {
            last_event_id: 14,
            ..
        }
    ));
    assert!(matches!(
        r.query(Some(15), Some(10)),
        WorkerKvQueryResponse::InvalidRange {
            start_id: 15,
            end_id: 10
        }
    ));
    assert!(matches!(
        r.query(Some(100), Some(200)),
        WorkerKvQueryResponse::TooNew {
            newest_available: 14,
            ..
        }
    ));
    let empty = Reference::new(7, 2, 5).unwrap();
    assert_eq!(
        empty.query_json(None, None).unwrap(),
        r#"{"TreeDump":{"events":[],"last_event_id":0,"reset_scope":"all"}}"#
    );
}

#[test]
fn reference_refuses_block_size_zero_and_events_after_shutdown() {
    assert!(matches!(
        Reference::new(1, 0, 5),
        Err(Error::BadArgument(_))
    ));
    let r = Reference::new(1, 2, 5).unwrap();
    r.shutdown();
    r.shutdown();
    // The indexer's thread stops asynchronously; IndexerOffline is what a send sees once it
    // has. The bound only keeps a broken build from hanging.
    let mut refused = false;
    for seq in 0..100_000 {
        if let Err(e) = r.apply(trace::cleared_event(1, seq, 0)) {
            assert!(matches!(e, Error::Indexer(_)), "{e}");
            refused = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert!(refused, "apply after shutdown never failed");
}

/// The stale-block-hash decision (docs/decisions.md) pinned against the real crate: a re-stored block under a new hash
/// replaces the old hash in the dump.
#[test]
fn reference_dump_carries_the_new_hash_of_a_restored_block() {
    let r = Reference::new(7, 2, 100).unwrap();
    r.apply(stored(1, &[1, 1], &[101], None)).unwrap();
    r.apply(stored(2, &[2, 2], &[102], Some(101))).unwrap();
    r.apply(trace::removed_event(7, 3, 0, &[102])).unwrap();
    r.apply(stored(4, &[2, 2], &[103], Some(101))).unwrap();
    let dump = r.query_json(None, None).unwrap();
    assert!(dump.contains(r#""block_hash":103"#), "{dump}");
    assert!(!dump.contains(r#""block_hash":102"#), "{dump}");
}

// ---------------------------------------------------------------- consumer

const BS: u32 = 2;

fn live(c: &mut Consumer, w: u64, r: u32, line: &str) -> &'static str {
    c.apply_live(w, r, BS, &Op::parse(line).unwrap())
        .unwrap()
        .name()
}

fn ops_worker() -> (Reference, Vec<&'static str>) {
    let ops = vec![
        r#"{"op":"stored","seq":0,"tokens":[1,2,3,4],"hashes":[10,11]}"#,
        r#"{"op":"stored","seq":1,"tokens":[5,6],"hashes":[12],"parent":11}"#,
        r#"{"op":"stored","seq":2,"tokens":[7,8,9,9],"hashes":[13,14],"parent":10}"#,
        r#"{"op":"removed","seq":3,"hashes":[12]}"#,
        r#"{"op":"stored","seq":4,"tokens":[9,9],"hashes":[20]}"#,
    ];
    let r = Reference::new(7, BS, 3).unwrap();
    for op in &ops {
        r.apply_op(&Op::parse(op).unwrap()).unwrap();
    }
    (r, ops)
}

#[test]
fn consumer_events_path_rebuilds_the_live_state() {
    let (r, ops) = ops_worker();
    let mut all_live = Consumer::new();
    for op in &ops {
        live(&mut all_live, 9, 1, op);
    }
    // Missed seqs 2..=4: recover with start=2 (in the buffer of 3) → Events.
    let mut gap = Consumer::new();
    assert_eq!(live(&mut gap, 9, 1, ops[0]), "initial");
    assert_eq!(live(&mut gap, 9, 1, ops[1]), "contiguous");
    assert_eq!(gap.observe(9, 1, 5).name(), "gap");
    let body = r.query_json(Some(2), Some(5)).unwrap();
    assert_eq!(gap.apply_recovery_json(9, 1, &body).unwrap(), "Events");
    assert_eq!(gap.watermark(9, 1), Some(4));
    assert_eq!(gap.state(), all_live.state());
    // events landed under the consumer's identity, not the worker's own (7, 0)
    assert!(gap.state().contains(r#""worker_id":9,"dp_rank":1"#));
    assert!(!gap.state().contains(r#""worker_id":7"#));
    // stale replays are dropped by the live path
    assert_eq!(live(&mut gap, 9, 1, ops[4]), "stale");
    assert_eq!(gap.state(), all_live.state());
}

#[test]
fn consumer_tree_dump_resets_only_its_rank() {
    let (r, ops) = ops_worker();
    let mut want = Consumer::new();
    let mut c = Consumer::new();
    for cons in [&mut want, &mut c] {
        // another rank of the same worker, and another worker
        live(
            cons,
            9,
            0,
            r#"{"op":"stored","seq":0,"tokens":[1,2],"hashes":[10]}"#,
        );
        live(
            cons,
            8,
            1,
            r#"{"op":"stored","seq":0,"tokens":[1,2],"hashes":[10]}"#,
        );
    }
    for op in &ops {
        live(&mut want, 9, 1, op);
    }
    // c holds junk for (9, 1) that the dump must wipe
    live(
        &mut c,
        9,
        1,
        r#"{"op":"stored","seq":0,"tokens":[4,4],"hashes":[99]}"#,
    );
    let body = r.query_json(Some(0), Some(5)).unwrap(); // 0 is older than the buffer → TreeDump
    assert!(body.starts_with(r#"{"TreeDump""#), "{body}");
    assert_eq!(c.apply_recovery_json(9, 1, &body).unwrap(), "TreeDump");
    assert_eq!(c.watermark(9, 1), Some(4));
    assert_eq!(c.state(), want.state());

    // a legacy TreeDump (no reset_scope) resets too
    let legacy = body.replace(r#","reset_scope":"all""#, "");
    let mut c2 = Consumer::new();
    live(
        &mut c2,
        9,
        1,
        r#"{"op":"stored","seq":0,"tokens":[4,4],"hashes":[99]}"#,
    );
    assert_eq!(c2.apply_recovery_json(9, 1, &legacy).unwrap(), "TreeDump");
    assert!(!c2.state().contains(",99]"), "{}", c2.state());

    // a domain-scoped TreeDump is applied without the reset
    let scoped = body.replace(
        r#""reset_scope":"all""#,
        r#""reset_scope":{"domain":"worker"}"#,
    );
    let mut c3 = Consumer::new();
    live(
        &mut c3,
        9,
        1,
        r#"{"op":"stored","seq":0,"tokens":[4,4],"hashes":[99]}"#,
    );
    assert_eq!(c3.apply_recovery_json(9, 1, &scoped).unwrap(), "TreeDump");
    assert!(c3.state().contains(",99]"), "{}", c3.state());
}

#[test]
fn consumer_does_nothing_on_other_answers() {
    let mut c = Consumer::new();
    live(
        &mut c,
        9,
        0,
        r#"{"op":"stored","seq":3,"tokens":[1,2],"hashes":[10]}"#,
    );
    let before = c.state();
    for (body, name) in [
        (
            r#"{"TooNew":{"requested_start":9,"requested_end":10,"newest_available":2}}"#,
            "TooNew",
        ),
        (
            r#"{"InvalidRange":{"start_id":9,"end_id":3}}"#,
            "InvalidRange",
        ),
        (r#"{"Error":"kvshm: event id 80 was lost"}"#, "Error"),
        (
            r#"{"TreeDumpFailed":{"last_event_id":40,"message":"x"}}"#,
            "TreeDumpFailed",
        ),
    ] {
        assert_eq!(c.apply_recovery_json(9, 0, body).unwrap(), name);
        assert_eq!(c.state(), before, "{name}");
        assert_eq!(c.watermark(9, 0), Some(3), "{name}");
    }
    assert!(matches!(
        c.apply_recovery_json(9, 0, r#"{"Events":[]}"#),
        Err(Error::Parse(_))
    ));
}

#[test]
fn consumer_state_is_canonical() {
    // the same blocks in another order and split → the same string
    let mut a = Consumer::new();
    live(
        &mut a,
        1,
        0,
        r#"{"op":"stored","seq":0,"tokens":[1,2,3,4],"hashes":[10,11]}"#,
    );
    live(
        &mut a,
        2,
        0,
        r#"{"op":"stored","seq":0,"tokens":[1,2],"hashes":[10]}"#,
    );
    let mut b = Consumer::new();
    live(
        &mut b,
        2,
        0,
        r#"{"op":"stored","seq":0,"tokens":[1,2],"hashes":[10]}"#,
    );
    live(
        &mut b,
        1,
        0,
        r#"{"op":"stored","seq":0,"tokens":[1,2],"hashes":[10]}"#,
    );
    live(
        &mut b,
        1,
        0,
        r#"{"op":"stored","seq":1,"tokens":[3,4],"hashes":[11],"parent":10}"#,
    );
    assert_eq!(a.state(), b.state());
    // same path, another block hash → different
    let mut c = Consumer::new();
    live(
        &mut c,
        1,
        0,
        r#"{"op":"stored","seq":0,"tokens":[1,2,3,4],"hashes":[10,12]}"#,
    );
    live(
        &mut c,
        2,
        0,
        r#"{"op":"stored","seq":0,"tokens":[1,2],"hashes":[10]}"#,
    );
    assert_ne!(a.state(), c.state());
    // empty
    assert_eq!(Consumer::new().state(), r#"{"workers":[]}"#);
    // routing agrees with the state
    let h = trace::stored_blocks(&input(2, &[1, 2, 3, 4], &[10, 11]));
    let q: Vec<u64> = h.iter().map(|b| b.tokens_hash.0).collect();
    assert_eq!(a.find_matches(&q), vec![(1, 0, 2), (2, 0, 1)]);
    assert_eq!(a.find_matches(&q), b.find_matches(&q));
    // a query op is not a live event
    assert!(matches!(
        a.apply_live(
            1,
            0,
            2,
            &Op::parse(r#"{"op":"query","start":1,"end":2}"#).unwrap()
        ),
        Err(Error::BadOp(_))
    ));
}

// ---------------------------------------------------------------- parse_response

const NEW_SHAPE: &str = r#"{"TreeDump":{"events":[{"worker_id":7,"storage_tier":"device","residency_domain":"worker","event":{"event_id":0,"data":{"stored":{"parent_hash":null,"start_position":null,"blocks":[{"block_hash":101,"tokens_hash":5,"mm_extra_info":null},{"block_hash":102,"tokens_hash":6,"mm_extra_info":null}]}},"dp_rank":0}}],"last_event_id":2,"reset_scope":"all"}}"#;
const OLD_SHAPE: &str = r#"{"TreeDump":{"events":[{"worker_id":7,"storage_tier":"device","event":{"event_id":0,"data":{"stored":{"parent_hash":null,"start_position":null,"blocks":[{"block_hash":101,"tokens_hash":5,"mm_extra_info":null}]}},"dp_rank":0}},{"worker_id":7,"storage_tier":"device","event":{"event_id":1,"data":{"stored":{"parent_hash":101,"start_position":null,"blocks":[{"block_hash":102,"tokens_hash":6,"mm_extra_info":null}]}},"dp_rank":0}}],"last_event_id":2}}"#;

#[test]
fn parse_response_both_shapes_with_both_types() {
    // 1.6.1 round-trips its own shape byte for byte and fills reset_scope into the old one
    assert_eq!(wire::parse_response(NEW_SHAPE, "1.6.1").unwrap(), NEW_SHAPE);
    let old_as_new = wire::parse_response(OLD_SHAPE, "1.6.1").unwrap();
    assert!(
        old_as_new.ends_with(r#""last_event_id":2,"reset_scope":"all"}}"#),
        "{old_as_new}"
    );
    // b2b7868 round-trips the old shape and drops what it does not know from the new one
    assert_eq!(
        wire::parse_response(OLD_SHAPE, "b2b7868").unwrap(),
        OLD_SHAPE
    );
    let new_as_old = wire::parse_response(NEW_SHAPE, "b2b7868").unwrap();
    assert!(!new_as_old.contains("reset_scope") && !new_as_old.contains("residency_domain"));
    assert_eq!(
        new_as_old,
        NEW_SHAPE
            .replace(r#","residency_domain":"worker""#, "")
            .replace(r#","reset_scope":"all""#, "")
    );
    // every variant the reference writes parses with the old types
    let (r, _) = ops_worker();
    for (s, e) in [
        (None, None),
        (Some(2), Some(4)),
        (Some(9), Some(3)),
        (Some(90), Some(99)),
    ] {
        let body = r.query_json(s, e).unwrap();
        wire::parse_response(&body, "b2b7868").unwrap_or_else(|e| panic!("{body}: {e}"));
    }
}

#[test]
fn parse_response_failures() {
    let cases: Vec<(&str, &str)> = vec![
        // pre-#8021 tuple variants
        (r#"{"Events":[]}"#, "1.6.1"),
        (r#"{"Events":[]}"#, "b2b7868"),
        // the older types have no default for last_event_id
        (r#"{"TreeDump":{"events":[]}}"#, "b2b7868"),
        // negative hashes never parse
        (
            r#"{"Events":{"events":[{"worker_id":1,"event":{"event_id":1,"data":{"removed":{"block_hashes":[-1]}}}}],"last_event_id":1}}"#,
            "1.6.1",
        ),
        (
            r#"{"Events":{"events":[{"worker_id":1,"event":{"event_id":1,"data":{"removed":{"block_hashes":[-1]}}}}],"last_event_id":1}}"#,
            "b2b7868",
        ),
        // an unknown variant
        (r#"{"Nope":1}"#, "b2b7868"),
        (r#"{"Nope":1}"#, "1.6.1"),
        ("", "1.6.1"),
    ];
    for (body, types) in cases {
        assert!(
            matches!(wire::parse_response(body, types), Err(Error::Parse(_))),
            "{types}: {body}"
        );
    }
    assert!(matches!(
        wire::parse_response(OLD_SHAPE, "1.5"),
        Err(Error::BadArgument(_))
    ));
    // missing storage_tier and dp_rank default in both
    let minimal = r#"{"Events":{"events":[{"worker_id":1,"event":{"event_id":1,"data":"cleared"}}],"last_event_id":1}}"#;
    for types in ["1.6.1", "b2b7868"] {
        let out = wire::parse_response(minimal, types).unwrap();
        assert!(
            out.contains(r#""storage_tier":"device""#) && out.contains(r#""dp_rank":0"#),
            "{out}"
        );
    }
}
