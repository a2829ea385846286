//! `replay`: a trace (JSON Lines, contract "Trace format") on stdin through Dynamo 1.6.1's
//! real `LocalKvIndexer`; the same trace on stdout with every query op's `answer` set to
//! the indexer's `WorkerKvQueryResponse` (byte-exact serde_json output).
//!
//! Non-query lines are copied verbatim (blank lines dropped). A query line is written with
//! its keys sorted and `answer` replaced. Exit status 1 with a message naming the line on
//! malformed input.

use std::io::{self, BufRead, BufWriter, Write};
use std::process::ExitCode;

use kvshm_conformance::reference::Reference;
use kvshm_conformance::trace::{Header, Op};
use serde_json::Value;

fn run() -> Result<(), String> {
    let stdin = io::stdin().lock();
    let mut out = BufWriter::new(io::stdout().lock());
    let mut lines = stdin.lines().enumerate();
    let (_, first) = lines.next().ok_or("empty trace: no header line")?;
    let first = first.map_err(|e| format!("read line 1: {e}"))?;
    let header: Header =
        serde_json::from_str(&first).map_err(|e| format!("line 1: bad header: {e}"))?;
    let reference = Reference::new(header.worker_id, header.block_size, header.max_buffer_size)
        .map_err(|e| format!("line 1: {e}"))?;
    writeln!(out, "{first}").map_err(|e| e.to_string())?;
    for (i, line) in lines {
        let n = i + 1;
        let line = line.map_err(|e| format!("read line {n}: {e}"))?;
        if line.trim().is_empty() {
            continue;
        }
        let op = Op::parse(&line).map_err(|e| format!("line {n}: {e}"))?;
        match reference
            .apply_op(&op)
            .map_err(|e| format!("line {n}: {e}"))?
        {
            None => writeln!(out, "{line}").map_err(|e| e.to_string())?,
            Some(answer) => {
                let answer = serde_json::to_string(&answer).map_err(|e| e.to_string())?;
                let Value::Object(fields) =
                    serde_json::from_str::<Value>(&line).map_err(|e| format!("line {n}: {e}"))?
                else {
                    return Err(format!("line {n}: op is not an object"));
                };
                let mut rendered = String::from("{");
                for (k, v) in fields.iter().filter(|(k, _)| k.as_str() != "answer") {
                    rendered.push_str(&serde_json::to_string(k).unwrap());
                    rendered.push(':');
                    rendered.push_str(&serde_json::to_string(v).unwrap());
                    rendered.push(',');
                }
                rendered.push_str("\"answer\":");
                rendered.push_str(&answer);
                rendered.push('}');
                writeln!(out, "{rendered}").map_err(|e| e.to_string())?;
            }
        }
    }
    out.flush().map_err(|e| e.to_string())?;
    reference.shutdown();
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("replay: {e}");
            ExitCode::FAILURE
        }
    }
}
