//! Seeded random streams: a consumer fed every event live and consumers rebuilt from the
//! real LocalKvIndexer's answers (a TreeDump; Events from the first id) hold the same
//! canonical state. Checks the consumer port, the canonical state and the conversion
//! together against the crate. The seed is printed on failure; set KVSHM_CONF_SEED to replay one.

use kvshm_conformance::consumer::Consumer;
use kvshm_conformance::reference::Reference;
use kvshm_conformance::trace::Op;
use serde_json::json;

/// xorshift64*: enough randomness for stream shapes, reproducible everywhere.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const BS: u32 = 2;

/// Ops of one stream: stores under a resident parent or at the root, removes of resident
/// (and sometimes unknown) hashes, rare clears. Returns op lines.
fn stream(seed: u64, len: u64) -> Vec<String> {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut resident: Vec<u64> = Vec::new();
    let mut next_hash = 1000u64;
    let mut ops = Vec::new();
    for seq in 0..len {
        let roll = rng.below(100);
        let op = if roll < 60 || resident.is_empty() {
            let n = 1 + rng.below(3);
            let parent = if resident.is_empty() || rng.below(4) == 0 {
                None
            } else {
                Some(resident[rng.below(resident.len() as u64) as usize])
            };
            // few distinct tokens so that paths collide and nodes are shared and split
            let tokens: Vec<u64> = (0..n * BS as u64).map(|_| rng.below(3)).collect();
            let hashes: Vec<u64> = (0..n)
                .map(|_| {
                    next_hash += 1;
                    next_hash
                })
                .collect();
            resident.extend(&hashes);
            json!({"op":"stored","seq":seq,"dp_rank":0,"tokens":tokens,"hashes":hashes,"parent":parent})
        } else if roll < 98 {
            let k = 1 + rng.below(2);
            let mut hashes = Vec::new();
            for _ in 0..k {
                if rng.below(10) == 0 {
                    hashes.push(999_999); // unknown
                } else if !resident.is_empty() {
                    let i = rng.below(resident.len() as u64) as usize;
                    hashes.push(resident.swap_remove(i));
                }
            }
            json!({"op":"removed","seq":seq,"dp_rank":0,"hashes":hashes})
        } else {
            resident.clear();
            json!({"op":"cleared","seq":seq,"dp_rank":0})
        };
        ops.push(op.to_string());
    }
    ops
}

#[test]
fn rebuilt_consumers_match_the_live_one() {
    let seeds: Vec<u64> = match std::env::var("KVSHM_CONF_SEED") {
        Ok(s) => vec![s.parse().expect("KVSHM_CONF_SEED is a u64")],
        Err(_) => (1..=40).collect(),
    };
    for seed in seeds {
        let ops = stream(seed, 300);
        let reference = Reference::new(7, BS, 1000).unwrap();
        let mut live = Consumer::new();
        for line in &ops {
            let op = Op::parse(line).unwrap();
            reference.apply_op(&op).unwrap();
            live.apply_live(9, 0, BS, &op).unwrap();
        }
        let want = live.state();

        let mut from_dump = Consumer::new();
        let dump = reference.query_json(None, None).unwrap();
        assert_eq!(
            from_dump.apply_recovery_json(9, 0, &dump).unwrap(),
            "TreeDump"
        );
        assert_eq!(
            from_dump.state(),
            want,
            "seed {seed}: TreeDump rebuild differs\nops: {ops:#?}"
        );

        let mut from_events = Consumer::new();
        let events = reference.query_json(Some(0), Some(299)).unwrap();
        assert_eq!(
            from_events.apply_recovery_json(9, 0, &events).unwrap(),
            "Events"
        );
        assert_eq!(
            from_events.state(),
            want,
            "seed {seed}: Events rebuild differs"
        );
        assert_eq!(from_events.watermark(9, 0), Some(299));
    }
}
