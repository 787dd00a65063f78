package fusefs

import "sync"

// tokenVault holds the tokens of fresh reservations until their first read
// reveals them (docs/PROTOCOL.md §3): the store keeps only their hashes.
// Safe for concurrent use; its lock is a leaf (nothing else is locked or
// called while it is held).
type tokenVault struct {
	mu     sync.Mutex
	tokens map[string]string // lease id → token not yet revealed
}

// put keeps the token of lease id for its first read.
func (v *tokenVault) put(id, token string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.tokens == nil {
		v.tokens = make(map[string]string)
	}
	v.tokens[id] = token
}

// take returns and forgets the unrevealed token of lease id.
func (v *tokenVault) take(id string) (string, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	t, ok := v.tokens[id]
	delete(v.tokens, id)
	return t, ok
}

// forget drops the token of lease id, if it was never revealed.
func (v *tokenVault) forget(id string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	delete(v.tokens, id)
}
