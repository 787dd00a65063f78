package fusefs

import (
	"regexp"
	"strings"
	"syscall"
	"testing"
)

// TestErrnoNameEveryErrno checks that refusal log lines name every errno symbolically, the
// ones of flock waits (EAGAIN = EWOULDBLOCK, EINTR) included, and number the unknown ones.
func TestErrnoNameEveryErrno(t *testing.T) {
	symbolic := regexp.MustCompile(`^E[A-Z0-9]+$`)
	for e := syscall.Errno(1); e <= 133; e++ { // EPERM … EHWPOISON on Linux
		if strings.HasPrefix(e.Error(), "errno ") {
			continue // a number Linux leaves unassigned (41, 58)
		}
		if got := errnoName(e); !symbolic.MatchString(got) {
			t.Errorf("errnoName(%d) = %q, want a symbolic name", int(e), got)
		}
	}
	for _, c := range []struct {
		e    syscall.Errno
		want string
	}{
		{syscall.EAGAIN, "EAGAIN"},
		{syscall.EWOULDBLOCK, "EAGAIN"}, // the same number on Linux
		{syscall.EINTR, "EINTR"},
		{syscall.ENOLCK, "ENOLCK"},
		{syscall.ENODATA, "ENODATA"},
		{syscall.Errno(4095), "errno 4095"},
	} {
		if got := errnoName(c.e); got != c.want {
			t.Errorf("errnoName(%d) = %q, want %q", int(c.e), got, c.want)
		}
	}
}
