package leasecore

import (
	"os"
	"strings"
	"sync"
)

// bootID reads the boot id once per process; it cannot change while the
// process runs.
var bootID = sync.OnceValue(func() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
})

// BootID returns this machine's boot id, the trimmed content of
// /proc/sys/kernel/random/boot_id (a UUID that changes at every boot), or ""
// when it cannot be read (not Linux, no /proc). It is read once per process
// and is safe for concurrent use.
func BootID() string { return bootID() }

// Hostname returns the host name reported by [os.Hostname], or "unknown-host"
// when it fails or is empty. It is not cached (the host name can change) and
// is safe for concurrent use.
func Hostname() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "unknown-host"
	}
	return h
}
