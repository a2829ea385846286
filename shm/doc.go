// Package shm will own the single-producer/single-consumer ring in shared memory: its byte layout, the Go writer
// and reader, mapping and record validation. Every unsafe and atomic operation of kvshm lives here.
package shm
