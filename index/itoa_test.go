package index

import (
	"math/rand/v2"
	"strconv"
	"testing"
)

// TestAppendU64 checks appendU64 against strconv at every digit-count boundary, a dense low range and random
// values of every magnitude.
func TestAppendU64(t *testing.T) {
	check := func(v uint64) {
		t.Helper()
		if got, want := string(appendU64([]byte("x"), v)), "x"+strconv.FormatUint(v, 10); got != want {
			t.Fatalf("appendU64(%d) = %q, want %q", v, got, want)
		}
	}
	for v := range uint64(200_000) {
		check(v)
	}
	for p, i := uint64(1), 0; i < 20; p, i = p*10, i+1 {
		check(p - 1)
		check(p)
		check(p + 1)
	}
	check(^uint64(0))
	r := rand.New(rand.NewPCG(1, 2))
	for range 500_000 {
		v := r.Uint64()
		check(v)
		check(v >> (r.Uint64() % 64))
	}
}

func FuzzAppendU64(f *testing.F) {
	for _, v := range []uint64{0, 9, 10, 99999999, 100000000, 1e16 - 1, 1e16, ^uint64(0)} {
		f.Add(v)
	}
	f.Fuzz(func(t *testing.T, v uint64) {
		if got, want := string(appendU64(nil, v)), strconv.FormatUint(v, 10); got != want {
			t.Fatalf("appendU64(%d) = %q, want %q", v, got, want)
		}
	})
}

func BenchmarkAppendU64(b *testing.B) {
	r := rand.New(rand.NewPCG(3, 3))
	vals := make([]uint64, 1024)
	for i := range vals {
		vals[i] = r.Uint64()
	}
	buf := make([]byte, 0, 32<<10)
	b.Run("impl=strconv", func(b *testing.B) {
		for b.Loop() {
			buf = buf[:0]
			for _, v := range vals {
				buf = strconv.AppendUint(buf, v, 10)
			}
		}
	})
	b.Run("impl=swar", func(b *testing.B) {
		for b.Loop() {
			buf = buf[:0]
			for _, v := range vals {
				buf = appendU64(buf, v)
			}
		}
	})
}
