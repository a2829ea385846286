//! The standalone judge end to end over real libzmq sockets: a PUB + ROUTER engine in this test,
//! 1.6.1's listener in the judge. A batch is re-sent until the judge shows it (a duplicate seq is
//! stale to the listener: dropped), so no test waits a fixed time; the deadline only bounds a hang.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use dynamo_kv_router::protocols::{BlockHashOptions, compute_block_hash_for_seq};
use kvshm_conformance::Error;
use kvshm_conformance::judge::StandaloneJudge;

const DEADLINE: Duration = Duration::from_secs(20);
const BS: u32 = 4;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// vLLM's array-like BlockStored (old vLLM shape; 1.6.1 parses both shapes).
fn stored(hash: u64, parent: Option<u64>, token: u32) -> Vec<u8> {
    let event = (
        "BlockStored",
        vec![hash],
        parent,
        vec![token; BS as usize],
        BS as usize,
        Option::<u64>::None,
        "GPU",
    );
    rmp_serde::to_vec(&(0.0_f64, vec![event], Some(0_i32))).unwrap()
}

struct Engine {
    pub_sock: zmq::Socket,
    sent: Arc<Mutex<Vec<(u64, Vec<u8>)>>>,
    stop: Arc<AtomicBool>,
    replay: Option<thread::JoinHandle<usize>>,
    endpoint: String,
    replay_endpoint: String,
}

impl Engine {
    fn new() -> Self {
        let ctx = zmq::Context::new();
        let pub_sock = ctx.socket(zmq::PUB).unwrap();
        let (p, r) = (free_port(), free_port());
        pub_sock.bind(&format!("tcp://127.0.0.1:{p}")).unwrap();
        let router = ctx.socket(zmq::ROUTER).unwrap();
        router.set_rcvtimeo(50).unwrap();
        router.bind(&format!("tcp://127.0.0.1:{r}")).unwrap();
        let sent: Arc<Mutex<Vec<(u64, Vec<u8>)>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (sent2, stop2) = (sent.clone(), stop.clone());
        // vLLM's replay: [id, "", topic, seq, payload] per buffered batch >= start, then the end marker.
        let replay = thread::spawn(move || {
            let mut served = 0;
            while !stop2.load(Ordering::Relaxed) {
                let Ok(req) = router.recv_multipart(0) else {
                    continue;
                };
                assert_eq!(req.len(), 3, "a replay request is [id, empty, start]");
                let start = u64::from_be_bytes(req[2][..8].try_into().unwrap());
                served += 1;
                for (seq, payload) in sent2.lock().unwrap().iter() {
                    if *seq >= start {
                        let frames = vec![
                            req[0].clone(),
                            vec![],
                            vec![],
                            seq.to_be_bytes().to_vec(),
                            payload.clone(),
                        ];
                        router.send_multipart(frames, 0).unwrap();
                    }
                }
                let end = vec![
                    req[0].clone(),
                    vec![],
                    vec![],
                    u64::MAX.to_be_bytes().to_vec(),
                    vec![],
                ];
                router.send_multipart(end, 0).unwrap();
            }
            served
        });
        Self {
            pub_sock,
            sent,
            stop,
            replay: Some(replay),
            endpoint: format!("tcp://127.0.0.1:{p}"),
            replay_endpoint: format!("tcp://127.0.0.1:{r}"),
        }
    }

    /// Buffer batch `seq` and publish it once.
    fn publish(&self, seq: u64, payload: Vec<u8>) {
        self.pub_sock
            .send_multipart([vec![], seq.to_be_bytes().to_vec(), payload.clone()], 0)
            .unwrap();
        let mut sent = self.sent.lock().unwrap();
        if !sent.iter().any(|(s, _)| *s == seq) {
            sent.push((seq, payload));
        }
    }

    /// Publish `seq` again and again until `done()` (a slow-joining SUB misses the first sends).
    fn publish_until(&self, seq: u64, payload: Vec<u8>, done: impl Fn() -> bool) {
        let t0 = Instant::now();
        loop {
            self.publish(seq, payload.clone());
            if done() {
                return;
            }
            assert!(t0.elapsed() < DEADLINE, "seq {seq} never reached the judge");
            thread::sleep(Duration::from_millis(20));
        }
    }

    fn finish(mut self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        self.replay.take().unwrap().join().unwrap()
    }
}

fn chain(tokens: &[u32]) -> Vec<u64> {
    let flat: Vec<u32> = tokens.iter().flat_map(|&t| [t; BS as usize]).collect();
    compute_block_hash_for_seq(&flat, BS, BlockHashOptions::default())
        .into_iter()
        .map(|h| h.0)
        .collect()
}

fn depth(judge: &StandaloneJudge, tokens: &[u32]) -> u32 {
    judge
        .find_matches(&chain(tokens))
        .unwrap()
        .iter()
        .find(|(w, r, _)| (*w, *r) == (1, 0))
        .map_or(0, |m| m.2)
}

#[test]
fn a_paused_listener_fills_its_gap_through_the_replay_socket() {
    let engine = Engine::new();
    let judge = StandaloneJudge::new(1).unwrap();
    judge
        .register(1, 0, &engine.endpoint, Some(&engine.replay_endpoint), BS)
        .unwrap();
    engine.publish_until(0, stored(100, None, 1), || depth(&judge, &[1]) == 1);

    judge.pause(1, 0).unwrap();
    assert!(
        judge
            .workers_json()
            .unwrap()
            .contains(r#""status":"paused""#)
    );
    engine.publish(1, stored(101, Some(100), 2));
    engine.publish(2, stored(102, Some(101), 3));
    assert_eq!(
        depth(&judge, &[1, 2, 3]),
        1,
        "a paused listener applies nothing"
    );

    judge.resume(1, 0).unwrap();
    engine.publish_until(3, stored(103, Some(102), 4), || {
        depth(&judge, &[1, 2, 3, 4]) == 4
    });
    let log = judge.log();
    let gap = log
        .iter()
        .find(|l| l.message.starts_with("Gap detected"))
        .expect("a gap line");
    assert_eq!(gap.fields.get("expected").map(String::as_str), Some("1"));
    assert_eq!(gap.fields.get("got").map(String::as_str), Some("3"));
    let replay = log
        .iter()
        .find(|l| l.message == "Replay complete")
        .expect("a replay line");
    assert!(replay.fields["replayed"].parse::<u64>().unwrap() >= 2);
    let state = judge.state().unwrap();
    assert!(state.starts_with(r#"{"device":{"workers":[{"worker_id":1,"dp_rank":0,"blocks":"#));
    assert!(engine.finish() >= 1);
}

#[test]
fn a_late_judge_replays_from_zero() {
    let engine = Engine::new();
    engine.publish(0, stored(200, None, 5));
    engine.publish(1, stored(201, Some(200), 6));
    let judge = StandaloneJudge::new(1).unwrap();
    judge
        .register(1, 0, &engine.endpoint, Some(&engine.replay_endpoint), BS)
        .unwrap();
    engine.publish_until(2, stored(202, Some(201), 7), || {
        depth(&judge, &[5, 6, 7]) == 3
    });
    let gap = judge
        .log()
        .into_iter()
        .find(|l| l.message.starts_with("Gap detected"))
        .expect("a gap line");
    assert_eq!(gap.fields.get("expected").map(String::as_str), Some("0"));
    engine.finish();
}

#[test]
fn what_1_6_1_refuses_is_an_error() {
    let judge = StandaloneJudge::new(1).unwrap();
    assert!(matches!(
        judge.register(1, 0, "tcp://127.0.0.1:1", None, 0),
        Err(Error::BadArgument(_))
    ));
    judge.register(1, 0, "tcp://127.0.0.1:1", None, BS).unwrap();
    assert!(matches!(
        judge.register(1, 0, "tcp://127.0.0.1:1", None, BS),
        Err(Error::BadArgument(_))
    ));
    assert!(matches!(
        judge.register(2, 0, "tcp://127.0.0.1:2", None, BS + 1),
        Err(Error::BadArgument(_))
    ));
    assert!(matches!(judge.pause(9, 0), Err(Error::BadArgument(_))));
    assert!(matches!(judge.resume(1, 0), Err(Error::BadArgument(_))));
    assert_eq!(judge.state().unwrap(), "{}");
    // The log belongs to this judge only: lines of other judges' threads are not in it.
    assert!(
        judge
            .log()
            .iter()
            .all(|l| !l.message.starts_with("Gap detected"))
    );
}
