package deps

import (
	_ "github.com/edsrzf/mmap-go"
	_ "github.com/google/flatbuffers/go"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/zeebo/xxh3"
	_ "golang.org/x/sys/unix"
)
