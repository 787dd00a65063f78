package leasecore

import (
	"errors"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"
)

// waitersName is the file in the state directory in which the serving
// daemon publishes its blocked flock waiters per resource, as TOML
// `"resource" = count` lines, for "leasefs ls" and "leasefs status". It is
// advisory: written without fsync, removed when a daemon opens the store,
// and ignored when no daemon serves the directory.
const waitersName = "waiters.toml"

// publishWaiters rewrites the waiters file with counts (temporary file and
// rename, no fsync; persister). Failures are logged at debug level only:
// the counts are informational.
func (s *FileStore) publishWaiters(counts map[string]int) {
	path := filepath.Join(s.state, waitersName)
	if len(counts) == 0 {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			s.opts.Logger.Debug("removing the waiters file failed", "err", err)
		}
		return
	}
	var b strings.Builder
	for _, r := range slices.Sorted(maps.Keys(counts)) {
		b.WriteString(QuoteTOML(r) + " = " + strconv.Itoa(counts[r]) + "\n")
	}
	tmp := filepath.Join(s.state, "."+waitersName+".tmp")
	err := os.WriteFile(tmp, []byte(b.String()), 0o600)
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		s.opts.Logger.Debug("writing the waiters file failed", "err", err)
	}
}

// loadWaiters returns the counts in the waiters file of a serving daemon;
// a missing or corrupt file means no waiters.
func (s *FileStore) loadWaiters() map[string]int {
	out := make(map[string]int)
	data, err := os.ReadFile(filepath.Join(s.state, waitersName))
	if err != nil {
		return out
	}
	m := make(map[string]int64)
	if _, err := toml.Decode(string(data), &m); err != nil {
		return out
	}
	for r, n := range m {
		if n > 0 && n <= 1<<31-1 {
			out[r] = int(n)
		}
	}
	return out
}

// removeWaiters removes the waiters file of a previous daemon, whose
// waiters died with it.
func (s *FileStore) removeWaiters() {
	_ = os.Remove(filepath.Join(s.state, waitersName))
	_ = os.Remove(filepath.Join(s.state, "."+waitersName+".tmp"))
}
