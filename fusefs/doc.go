// Package fusefs maps the FUSE protocol onto a [leasecore.Store]: every
// regular file in the mount is one live lease named by its resource, and
// every directory a namespace (docs/PROTOCOL.md §3).
//
// # Nodes
//
// [FS] owns the shared state (the store, tokens not yet revealed, inode
// numbers of namespaces, the queue of kernel invalidations). dirNode serves
// the root and the namespaces: lookup, create (reserve), unlink (release),
// mkdir, rmdir, readdir. leaseNode serves one lease: getattr, setattr,
// open, xattrs. leaseHandle is one open file description: reads (token once,
// then the status document) and writes (renew, commands).
//
// # Identity
//
// A lease node's inode number is derived from the lease's generation, so it
// is never reused, and a handle is bound to the lease id it was opened on:
// once that lease ends the handle answers ESTALE (docs/PROTOCOL.md §3).
//
// # Invalidations
//
// Kernel notifications (NotifyDelete) and the daemon's own unlinks of
// ended names (self-unlinks, which raise IN_DELETE: docs/PROTOCOL.md §6a)
// are made only from the goroutine of [FS.Run] and the self-unlink worker,
// never inside a FUSE handler and with no lock held, because a notification
// or a call on the mount from a handler deadlocks the kernel
// (docs/ARCHITECTURE.md, kernel facts and "Self-unlinks").
//
// # Errors
//
// errno.go maps leasecore errors to errno in one place (docs/PROTOCOL.md §9); every
// refusal is logged as one line naming the operation, resource, caller and
// reason.
package fusefs
