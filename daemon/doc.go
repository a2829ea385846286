// Package daemon will own kvshmd's streams, drain loops, Unix-socket query server, HTTP listener and metrics.
package daemon
