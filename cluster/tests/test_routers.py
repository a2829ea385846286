"""The llm-d router's /dump is read like Dynamo's; the table names router kinds; --strict asks of llm-d only what
its protocol lets kvshm make exact."""

from __future__ import annotations

import json

import pytest
from kvshm_cluster.__main__ import table
from kvshm_cluster.faults import FAULTS, Row, must_converge
from kvshm_cluster.router import dump_state, llmd_topic

# What cluster/llmd's /dump answers (the shape its TestDumpShape asserts): per pod W-R one Stored of the engine
# hashes llm-d holds; a pod that is not W-R is worker -1.
LLMD_DUMP = (
    '{"cluster:llmd":{"block_size":4,"events":['
    '{"worker_id":-1,"event":{"event_id":0,"dp_rank":0,"data":{"stored":{"parent_hash":null,"blocks":['
    '{"block_hash":9,"tokens_hash":0}]}}}},'
    '{"worker_id":100,"event":{"event_id":1,"dp_rank":1,"data":{"stored":{"parent_hash":null,"blocks":['
    '{"block_hash":6,"tokens_hash":0},{"block_hash":7,"tokens_hash":0}]}}}}]}}'
)


def test_llmd_dump_is_read_per_worker_and_rank() -> None:
    assert dump_state(json.loads(LLMD_DUMP)) == {(-1, 0): {9}, (100, 1): {6, 7}}
    assert dump_state(json.loads('{"cluster:llmd":{"block_size":4,"events":[]}}')) == {}


def test_llmd_topic_names_the_pod_llmd_dumps() -> None:
    # llm-d's vLLM adapter: kv@<pod>@<model>; cluster/llmd parses the pod as W-R.
    assert llmd_topic(100, 1) == "kv@100-1@cluster"


def _row(fault: str, kind: str, converged: bool, publisher: str = "kvshm", note: str = "") -> Row:
    return Row(fault, publisher, 1, 0 if converged else 3, 0, converged, 0.1 if converged else None, 10, note, kind)


FAULT_NAMES = ["router restart (in window)", "steady", "partition > window", "router restart (late)",
               "slow router (SIGSTOP)", "kvshmd SIGKILL+restart", "engine SIGKILL+restart"]


@pytest.mark.parametrize("fault", FAULT_NAMES)
def test_strict_asks_every_kvshm_row_of_both_kinds(fault: str) -> None:
    assert must_converge(_row(fault, "dynamo", False))
    assert must_converge(_row(fault, "llmd", False))
    assert not must_converge(_row(fault, "dynamo", False, publisher="vllm"))
    assert not must_converge(_row(fault, "llmd", True, note="n/a"))


def test_every_fault_is_named() -> None:
    assert len(FAULT_NAMES) == len(FAULTS)


def test_table_names_kinds_when_several_ran() -> None:
    rows = [_row("steady", "llmd", True), _row("steady", "dynamo", True), _row("partition > window", "llmd", False),
            _row("steady", "dynamo", False, publisher="vllm")]
    lines = table(rows).splitlines()
    assert lines[2].startswith("| steady | dynamo 1 | 0 / 0, yes, 0.1 s | 3 / 0, NO |")
    assert lines[3].startswith("| steady | llmd 1 | 0 / 0, yes, 0.1 s |")
    assert lines[4].startswith("| partition > window | llmd 1 | 3 / 0, NO |")
    # One kind (results.json before llm-d ran): routers by index, as before.
    assert table([_row("steady", "dynamo", True)]).splitlines()[2] == "| steady | 1 | 0 / 0, yes, 0.1 s |"
