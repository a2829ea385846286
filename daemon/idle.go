package daemon

import "time"

// How often an attached stream needs its drain worker when no record comes (attachment.Housekeep; package drain
// has the idle strategy: park first on the ring's doorbell, poll only while records come faster than a wakeup).
//
// The period is also the lost-doorbell bound: the Python producer cannot fence between its tail store and its load
// of consumer_parked, so (rarely) its wakeup is lost exactly when the worker arms the ring, and the record then
// waits for the worker's next wakeup, which comes at the latest at this deadline (shm/FORMAT.md, "Doorbell"). A
// publishing stream's subscribers see that delay, so it is short (and heartbeats are checked at that pace); a
// stream nobody subscribes to is read only by queries, whose barriers wake the worker at once, so its period only
// paces the ring snapshot, truncation check and CLOSED check (and the pid backstop runs every
// max(period, --pid-check-interval)). The worker coalesces the deadlines of its streams (drain/doc.go), so 64
// idle streams cost about 4 wakeups a second in all.
const (
	idleEvery        = 250 * time.Millisecond
	publishIdleEvery = 10 * time.Millisecond
)
