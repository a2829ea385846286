package daemon

import (
	"context"
	"os/exec"
	"testing"
)

// TestWaitExit: waitExit returns when the watched process exits (readable pidfd, no polling) or when its context
// ends, and says so; a process already gone is reported at once.
func TestWaitExit(t *testing.T) {
	start := func() *exec.Cmd {
		t.Helper()
		c := exec.Command("sleep", "60")
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Process.Kill(); _ = c.Wait() })
		return c
	}
	type result struct{ exited, ok bool }
	wait := func(ctx context.Context, pid int) <-chan result {
		ch := make(chan result, 1)
		go func() {
			exited, ok := waitExit(ctx, pid, 0)
			ch <- result{exited, ok}
		}()
		return ch
	}

	c := start()
	res := wait(context.Background(), c.Process.Pid)
	_ = c.Process.Kill() // a zombie until reaped: exited all the same
	if r := <-res; !r.ok || !r.exited {
		t.Fatalf("waitExit of a killed process = %+v, want exited", r)
	}
	_ = c.Wait()
	if r := <-wait(context.Background(), c.Process.Pid); r.ok && !r.exited {
		t.Fatalf("waitExit of a reaped process = %+v, want exited (or no pidfd)", r)
	}

	c = start()
	ctx, cancel := context.WithCancel(context.Background())
	res = wait(ctx, c.Process.Pid)
	cancel()
	if r := <-res; !r.ok || r.exited {
		t.Fatalf("waitExit after its context ended = %+v, want not exited", r)
	}
}
