//go:build !invariants

package index

// checkInvariants: built with -tags invariants, every applied event is followed by tree.check (a violation panics).
const checkInvariants = false
