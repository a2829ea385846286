package shm_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kvshm/kvshm/shm"
)

func Example() {
	dir, err := os.MkdirTemp("", "kvshm-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "worker-1.ring")

	w, err := shm.Create(path, shm.Options{Capacity: shm.MinCapacity, WorkerID: 1})
	if err != nil {
		panic(err)
	}
	defer w.Close()
	for seq, ev := range []string{"stored", "removed", "cleared"} {
		if err := w.WriteEvent(uint64(seq), []byte(ev)); err != nil {
			fmt.Println("dropped:", err) // ErrFull / ErrTooLarge: counted in the header, reported by a LOSS record
		}
	}

	r, err := shm.Open(path)
	if err != nil {
		panic(err)
	}
	defer r.Close()
	for {
		rec, err := r.Next()
		var ce *shm.CorruptionError
		switch {
		case errors.Is(err, shm.ErrEmpty):
			r.Release() // hand the drained bytes back to the producer
			st := r.Stats()
			fmt.Printf("head %d tail %d dropped %d\n", st.Head, st.Tail, st.DroppedEvents)
			return
		case errors.As(err, &ce):
			r.SkipToTail() // unread records are lost: treat the history as unknown
			continue
		case err != nil:
			panic(err)
		}
		fmt.Printf("type %d at %d: %s\n", rec.Type, rec.Pos, rec.Payload) // Payload is valid until Release
	}
	// Output:
	// type 1 at 0: stored
	// type 1 at 16: removed
	// type 1 at 32: cleared
	// head 48 tail 48 dropped 0
}
