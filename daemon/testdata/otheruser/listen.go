package main

import "syscall"

// listen marks the inherited socket as listening: the listener's credentials (what SO_PEERCRED reports to a
// client) are those of the process that calls listen(2).
func listen(fd int) error { return syscall.Listen(fd, 8) }
