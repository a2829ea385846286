// Package index will own the worker-local KV index: token hashing, the radix tree keyed by (worker_id, dp_rank),
// the bounded consecutive-id event log, recovery classification with its dump cache, and Dynamo's exact JSON.
package index
