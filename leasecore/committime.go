package leasecore

import "time"

// timedPersister is a persister that reports how long each durable change
// of the one it wraps took ([Options.OnCommit]). Like every persister it is
// called with the store's mutex held.
type timedPersister struct {
	persister
	onCommit func(time.Duration)
}

// timed runs change and reports its duration when it succeeded.
func (p timedPersister) timed(change func() error) error {
	start := time.Now()
	if err := change(); err != nil {
		return err
	}
	p.onCommit(time.Since(start))
	return nil
}

func (p timedPersister) writeRecord(l *Lease, tokenHash string) error {
	return p.timed(func() error { return p.persister.writeRecord(l, tokenHash) })
}

func (p timedPersister) removeRecords(ids []string) error {
	return p.timed(func() error { return p.persister.removeRecords(ids) })
}

func (p timedPersister) saveGeneration(hw uint64) error {
	return p.timed(func() error { return p.persister.saveGeneration(hw) })
}

func (p timedPersister) saveNamespaces(nss map[string]Namespace) error {
	return p.timed(func() error { return p.persister.saveNamespaces(nss) })
}
