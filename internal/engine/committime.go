package engine

import (
	"time"

	"github.com/leasefs/leasefs/leasecore"
)

// markingPersister is a persister that tells its store when a change
// started being persisted, so that the store can report how long the
// change took to become durable ([leasecore.Options.OnCommit]) once its commit is
// done. Like every persister it is called with the store's mutex held.
type markingPersister struct {
	Persister
	s *Engine
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

func (p markingPersister) WriteRecord(l *leasecore.Lease, tokenHash string) error {
	return p.mark(func() error { return p.Persister.WriteRecord(l, tokenHash) })
}

func (p markingPersister) RemoveRecords(ids []string) error {
	return p.mark(func() error { return p.Persister.RemoveRecords(ids) })
}

func (p markingPersister) SaveGeneration(g uint64) error {
	return p.mark(func() error { return p.Persister.SaveGeneration(g) })
}

func (p markingPersister) SaveNamespaces(nss map[string]leasecore.Namespace) error {
	return p.mark(func() error { return p.Persister.SaveNamespaces(nss) })
}
