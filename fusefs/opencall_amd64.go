package fusefs

import "golang.org/x/sys/unix"

// The legacy open calls of amd64: open(2) has its flags in the second
// argument, creat(2) always creates.
func init() {
	openCalls[unix.SYS_OPEN] = 1
	openCalls[unix.SYS_CREAT] = -1
}
