//! The `replay` binary end to end: answers filled from the real LocalKvIndexer, other lines verbatim.

use std::io::Write;
use std::process::{Command, Stdio};

fn replay(input: &str) -> (bool, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_replay"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn replay_fills_answers() {
    let input = [
        r#"{"trace":"t","worker_id":7,"block_size":4,"max_buffer_size":5}"#,
        r#"{"op":"stored","seq":1,"dp_rank":0,"tokens":[0,1,2,3],"hashes":[101],"parent":null,"lora_name":null,"is_eagle":null}"#,
        r#"{"op":"query","start":1,"end":1,"answer":null}"#,
        "",
        r#"{"op":"cleared","seq":2,"dp_rank":0}"#,
        r#"{"op":"query","start":null,"end":null}"#,
        r#"{"op":"query","start":5,"end":2,"answer":{"Error":"stale"}}"#,
    ]
    .join("\n");
    let (ok, out, err) = replay(&input);
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 6, "{out}");
    assert_eq!(lines[0], input.lines().next().unwrap());
    assert_eq!(lines[1], input.lines().nth(1).unwrap());
    assert_eq!(
        lines[2],
        r#"{"end":1,"op":"query","start":1,"answer":{"Events":{"events":[{"worker_id":7,"storage_tier":"device","residency_domain":"worker","event":{"event_id":1,"data":{"stored":{"parent_hash":null,"start_position":null,"blocks":[{"block_hash":101,"tokens_hash":9143094415614847814,"mm_extra_info":null}]}},"dp_rank":0}}],"last_event_id":1}}}"#
    );
    assert_eq!(lines[3], r#"{"op":"cleared","seq":2,"dp_rank":0}"#);
    assert_eq!(
        lines[4],
        r#"{"end":null,"op":"query","start":null,"answer":{"TreeDump":{"events":[],"last_event_id":2,"reset_scope":"all"}}}"#
    );
    assert_eq!(
        lines[5],
        r#"{"end":2,"op":"query","start":5,"answer":{"InvalidRange":{"start_id":5,"end_id":2}}}"#
    );
}

#[test]
fn replay_names_the_bad_line() {
    for (input, want) in [
        ("", "empty trace"),
        ("{}", "line 1: bad header"),
        (
            "{\"trace\":\"t\",\"worker_id\":7,\"block_size\":0,\"max_buffer_size\":5}",
            "line 1:",
        ),
        (
            "{\"trace\":\"t\",\"worker_id\":7,\"block_size\":2,\"max_buffer_size\":5}\n{\"op\":\"x\"}",
            "line 2: ",
        ),
    ] {
        let (ok, _, err) = replay(input);
        assert!(!ok, "{input}");
        assert!(err.contains(want), "{input}: {err}");
    }
}
