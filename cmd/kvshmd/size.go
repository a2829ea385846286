package main

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// sizeUnits are the units of sizes on serve's command line (--max-ring-bytes, --zmq-buffer-bytes, --max-memory,
// --gc-headroom), the longest suffix first.
var sizeUnits = []struct {
	suffix string
	mult   uint64
}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}, {"B", 1}}

// parseSize reads a positive byte count: digits, optionally followed by KiB, MiB, GiB (K, M, G: the same) or B.
func parseSize(s string) (uint64, error) {
	mult := uint64(1)
	for _, u := range sizeUnits {
		if rest, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = rest, u.mult
			break
		}
	}
	n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64)
	if err != nil || n == 0 || n > math.MaxUint64/mult {
		return 0, fmt.Errorf("want a positive size such as 64MiB")
	}
	return n * mult, nil
}

// formatSize writes n in the largest binary unit that divides it.
func formatSize(n uint64) string {
	for _, u := range sizeUnits[:3] {
		if n >= u.mult && n%u.mult == 0 {
			return fmt.Sprintf("%d%s", n/u.mult, u.suffix)
		}
	}
	return strconv.FormatUint(n, 10)
}
