// Command otheruser is run by the daemon tests as another uid (they need root): it plays a local user who is not
// the daemon's. Built by TestMain next to kvshmd.
//
//	otheruser health SOCKET   send a raw HEALTH frame (bypassing kvshmd's client checks) and print the reply
//	otheruser listen          listen(2) on the bound socket passed as fd 3, accept one connection, print
//	                          "listening", then "received N" with the bytes the client sent within 2 s
package main

import (
	"fmt"
	"net"
	"os"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fail(fmt.Errorf("usage: otheruser health SOCKET | otheruser listen"))
	}
	switch os.Args[1] {
	case "health":
		c, err := net.DialTimeout("unix", os.Args[2], 5*time.Second)
		if err != nil {
			fail(err)
		}
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		// [u32 length 4][version 1][kind 7][status 0]. A daemon refusing this uid may have replied and closed
		// already (EPIPE): its reply is still there to read.
		_, _ = c.Write([]byte{4, 0, 0, 0, 1, 7, 0, 0})
		buf := make([]byte, 4096)
		n, _ := c.Read(buf)
		fmt.Printf("%q\n", buf[:n])
	case "listen":
		f := os.NewFile(3, "bound")
		fd := int(f.Fd())
		if err := listen(fd); err != nil {
			fail(err)
		}
		l, err := net.FileListener(f)
		if err != nil {
			fail(err)
		}
		fmt.Println("listening")
		c, err := l.Accept()
		if err != nil {
			fail(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		buf := make([]byte, 4096)
		n, _ := c.Read(buf)
		fmt.Println("received", n)
	default:
		fail(fmt.Errorf("unknown mode %q", os.Args[1]))
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "otheruser:", err)
	os.Exit(1)
}
