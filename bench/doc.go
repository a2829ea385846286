// Package bench holds kvshm's performance goals as benchmarks that report ratios against baselines measured in
// the same run.
//
// `make bench` runs the Go benchmarks of this package and of index/ and proto/fbs/, then the Python ones:
// publish_bench.py and local_indexer_bench.py (the publish path against its floor and msgpack), and recovery_bench.py
// (the recovery goals: kvshm against Dynamo 1.6.1's LocalKvIndexer, the kvshm_conformance module built from
// conformance/ with maturin; publish cost, queries, the /kv_recover deployment, scale curves over resident blocks and
// attached workers; _child.py runs its engine, reference and publisher processes). Its section zmq is zmq_bench.py
// (kvshmd as the publisher): the engine's cost per KV-event batch with its own msgspec + pyzmq publisher and the
// reference or kvshm as the indexer, against kvshmd publishing the batch (LocalIndexer.apply_batch), inline and
// threaded as vLLM runs its publisher, and the publish-to-subscriber latency a pyzmq SUB in another process sees;
// _vllm.py holds the vLLM-shaped msgspec Structs and the seeded batches. results_report.py writes RESULTS.md and its
// PNG plots from that run's measurements; RESULTS.md is never edited by hand. Nothing fails on a threshold: a goal that
// is missed is printed as MISS with its numbers.
package bench
