package mount

import (
	"bufio"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// FusermountError reports that an unprivileged mount through fusermount3
// failed. fusermount3 writes its own message to the daemon's stderr, and
// go-fuse returns only its exit status, so Reason is what leasefs found
// wrong by checking the conditions fusermount3 needs; it is "" when none of
// them failed. It unwraps to go-fuse's error.
type FusermountError struct {
	Mountpoint string
	// Reason is the failed condition, e.g. "cannot open /dev/fuse:
	// permission denied"; "" when unknown.
	Reason string
	// Hint says what to do about it.
	Hint string
	Err  error
}

// Error says why the mount failed, as far as known, and what to do.
func (e *FusermountError) Error() string {
	msg := "mount: cannot mount on " + e.Mountpoint + ": "
	if e.Reason != "" {
		msg += e.Reason
	} else {
		msg += "fusermount3 failed (its message is printed above)"
	}
	return msg + "; " + e.Hint
}

// Unwrap returns go-fuse's error.
func (e *FusermountError) Unwrap() error { return e.Err }

// fuseSystem names what an unprivileged mount depends on; tests replace it.
type fuseSystem struct {
	device   string                       // the FUSE device, /dev/fuse
	conf     string                       // fusermount3's configuration, /etc/fuse.conf
	lookPath func(string) (string, error) // finds fusermount3 on PATH
}

// systemFuse is the real system.
var systemFuse = fuseSystem{device: "/dev/fuse", conf: "/etc/fuse.conf", lookPath: exec.LookPath}

// genericFuseHint lists what to check when no failed condition was found.
const genericFuseHint = "check that /dev/fuse is readable and writable by you, that fuse3 (fusermount3) is installed, " +
	"and for --allow-other that /etc/fuse.conf contains user_allow_other; or mount as root"

// newFusermountError describes the failure err of mounting mp through
// fusermount3.
func newFusermountError(mp string, allowOther bool, err error, sys fuseSystem) *FusermountError {
	reason, hint := sys.diagnose(mp, allowOther)
	if hint == "" {
		hint = genericFuseHint
	}
	return &FusermountError{Mountpoint: mp, Reason: reason, Hint: hint, Err: err}
}

// diagnose checks, in the order fusermount3 does, the conditions of an
// unprivileged mount of mp, and returns the first that fails and what to do
// about it; both are "" when all hold. fusermount3 opens the device and
// checks the mountpoint with the caller's own permissions, so the checks
// see what it sees.
func (sys fuseSystem) diagnose(mp string, allowOther bool) (reason, hint string) {
	bin, err := sys.lookPath("fusermount3")
	if err != nil {
		if bin, err = sys.lookPath("fusermount"); err != nil {
			return "fusermount3 is not installed", "install the fuse3 package, or mount as root"
		}
	}
	if st, err := os.Stat(bin); err == nil {
		if sysSt, ok := st.Sys().(*syscall.Stat_t); ok && (st.Mode()&fs.ModeSetuid == 0 || sysSt.Uid != 0) {
			return bin + " is not setuid root", "reinstall fuse3 (fusermount3 must be owned by root with the setuid bit), or mount as root"
		}
	}
	fd, err := unix.Open(sys.device, unix.O_RDWR|unix.O_CLOEXEC, 0)
	switch {
	case err == nil:
		unix.Close(fd)
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENODEV), errors.Is(err, unix.ENXIO):
		return sys.device + " does not exist", "load the fuse kernel module (modprobe fuse); in a container, pass the device in (--device /dev/fuse)"
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
		return "cannot open " + sys.device + ": " + err.Error(),
			"make " + sys.device + " readable and writable by you (it is normally crw-rw-rw-), or mount as root"
	default:
		return "cannot open " + sys.device + ": " + err.Error(), ""
	}
	if allowOther && !userAllowOther(sys.conf) {
		return "--allow-other needs user_allow_other in " + sys.conf,
			"add the line user_allow_other to " + sys.conf + " (as root), or mount without --allow-other"
	}
	if err := unix.Access(mp, unix.W_OK); err != nil {
		return "you have no write access to the mountpoint " + mp,
			"fusermount3 mounts only on directories you may write: use one you own"
	}
	return "", ""
}

// userAllowOther reports whether the fusermount3 configuration file conf
// enables user_allow_other (a line of its own; "#" starts a comment).
func userAllowOther(conf string) bool {
	f, err := os.Open(conf)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line, _, _ := strings.Cut(sc.Text(), "#")
		if strings.TrimSpace(line) == "user_allow_other" {
			return true
		}
	}
	return false
}
