package leasecore

import "time"

// markingPersister is a persister that tells its store when a change
// started being persisted, so that the store can report how long the
// change took to become durable ([Options.OnCommit]) once its commit is
// done. Like every persister it is called with the store's mutex held.
type markingPersister struct {
	persister
	s *store
}

// mark notes the start of a change, unless one is already pending.
func (p markingPersister) mark(change func() error) error {
	start := time.Now()
	if err := change(); err != nil {
		return err
	}
	if p.s.dirtySince.IsZero() {
		p.s.dirtySince = start
	}
	return nil
}

func (p markingPersister) writeRecord(l *Lease, tokenHash string) (st recordStamp, err error) {
	err = p.mark(func() error {
		st, err = p.persister.writeRecord(l, tokenHash)
		return err
	})
	return st, err
}

func (p markingPersister) removeRecords(ids []string) error {
	return p.mark(func() error { return p.persister.removeRecords(ids) })
}

func (p markingPersister) saveGeneration(g uint64) error {
	return p.mark(func() error { return p.persister.saveGeneration(g) })
}

func (p markingPersister) saveNamespaces(nss map[string]Namespace) error {
	return p.mark(func() error { return p.persister.saveNamespaces(nss) })
}
