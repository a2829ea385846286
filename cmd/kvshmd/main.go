// Command kvshmd is the kvshm daemon.
package main

func main() {}
