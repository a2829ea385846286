package daemon

import "testing"

// TestOwnFDPath: only /proc/<the peer's pid>/fd/<n> is followed at ATTACH (the producer's memfd ring).
func TestOwnFDPath(t *testing.T) {
	for _, c := range []struct {
		path string
		pid  int32
		want bool
	}{
		{"/proc/42/fd/3", 42, true},
		{"/proc/42/fd/1234", 42, true},
		{"/proc/42/fd/3", 43, false},
		{"/proc/420/fd/3", 42, false},
		{"/proc/42/fd/", 42, false},
		{"/proc/42/fd/x", 42, false},
		{"/proc/42/fd/3/..", 42, false},
		{"/proc/42/fd/-1", 42, false},
		{"/proc/self/fd/3", 42, false},
		{"/dev/shm/kvshm-w1.ring", 42, false},
	} {
		if got := ownFDPath(c.path, c.pid); got != c.want {
			t.Errorf("ownFDPath(%q, %d) = %v, want %v", c.path, c.pid, got, c.want)
		}
	}
}
