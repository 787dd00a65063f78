// Package daemonlock is the single-daemon lock of a leasefs state directory
// (docs/PROTOCOL.md §2, §8b): the serving daemon holds an exclusive flock(2)
// on a lock file, and two advisory JSON files beside it say who holds it and
// who asks for it.
//
// # Files
//
// For the lock file <state>/leasefs.lock:
//
//   - <state>/leasefs.lock is the lock file. [Acquire] creates it (mode
//     0600), empty. It is never removed, not even by [Lock.Release], and
//     nobody should remove it: the lock belongs to its inode, and a removed
//     file would let a newcomer lock a fresh file while the old holder
//     still holds the old one. The kernel lock on it alone decides who
//     serves; it goes when the holder calls [Lock.Release] or dies, so
//     nothing expires by time.
//   - <state>/leasefs.lock.json is the holder metadata ([Holder]: pid, boot
//     id, host, a client label such as "leasefs mount /mnt/leases", start
//     time), read with [ReadHolder]. [Acquire] writes it and [Lock.Release]
//     removes it. A holder that dies leaves it behind until the next Acquire
//     replaces it, so it explains a refusal but never proves that the lock is
//     held: [Held] asks the kernel through /proc/locks without locking.
//   - <state>/leasefs.takeover is a pending [TakeoverRequest]: anyone may
//     write it ([WriteTakeoverRequest]) to ask the holder to hand over; the
//     holder polls it ([ReadTakeoverRequest]) and decides. It is removed by
//     [ClearTakeoverRequest] and by [Lock.Release].
//
// Both JSON files are written atomically and durably (temporary file in the
// same directory, fsync, rename, directory fsync); temporary files left by a
// crash are removed by the next Acquire that gets the lock.
//
// # Concurrency
//
// Every function of the package, and every method of [Lock], is safe for
// concurrent use. Within one process a lock file is held at most once: a
// second Acquire of the same path fails with a *[HeldError] whose SameProcess
// is set, answered from a process-wide registry rather than by the kernel.
// [Holder], [TakeoverRequest] and [HeldError] are plain values.
package daemonlock
