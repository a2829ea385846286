// Package bench holds kvshm's performance goals as benchmarks that report ratios against baselines measured in
// the same run.
package bench
