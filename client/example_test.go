package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/leasefs/leasefs/client"
)

// A token lease held while an agent edits a branch: reserve it, keep it
// alive in the background, and give it back with a note when done. (mnt is
// the mountpoint, such as /mnt/leases.)
func ExampleReserve() {
	l, err := client.Reserve(mnt, "feature-a")
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lost := l.KeepAlive(ctx)

	// A second agent finds it held, and by whom.
	_, err = client.Reserve(mnt, "feature-a")
	var held *client.HeldError
	fmt.Println(errors.Is(err, client.ErrHeld), errors.As(err, &held) && held.UID == os.Getuid())

	// ... work, passing l.Generation() to what is written ...
	select {
	case err := <-lost:
		log.Fatal(err)
	default:
	}
	if err := l.Complete(client.Annotations{"anchor_state": "pushed"}); err != nil {
		log.Fatal(err)
	}
	fmt.Println(<-lost)
	// Output:
	// true true
	// <nil>
}

// flock(1) for Go: the lease lives while the lock does, and the kernel ends
// it if the process dies.
func ExampleLock() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h, err := client.Lock(ctx, mnt, "nightly-backup")
	if err != nil {
		log.Fatal(err)
	}
	defer h.Unlock()
	fmt.Println(h.Resource(), h.Generation() > 0)
	// Output: nightly-backup true
}

// A try-lock that names the holder when the name is taken.
func ExampleTryLock() {
	first, err := client.TryLock(mnt, "deploy")
	if err != nil {
		log.Fatal(err)
	}
	defer first.Unlock()

	_, err = client.TryLock(mnt, "deploy")
	var held *client.HeldError
	if errors.As(err, &held) {
		fmt.Println("held by pid", held.PID == os.Getpid())
	}
	// Output: held by pid true
}

// Cancelling the context ends a wait for a held name; nothing stays held or
// queued.
func ExampleLock_cancel() {
	holder, err := client.TryLock(mnt, "migrate")
	if err != nil {
		log.Fatal(err)
	}
	defer holder.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err = client.Lock(ctx, mnt, "migrate")
	fmt.Println(errors.Is(err, context.DeadlineExceeded))
	// Output: true
}

// A missing namespace is its own error, saying how to create it.
func ExampleNamespaceError() {
	_, err := client.Reserve(mnt, "no-such-ns/job")
	fmt.Println(errors.Is(err, client.ErrNoNamespace))
	if err := os.Mkdir(filepath.Join(mnt, "no-such-ns"), 0o1777); err != nil {
		log.Fatal(err)
	}
	l, err := client.Reserve(mnt, "no-such-ns/job")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(l.Resource())
	_ = l.Abandon(nil)
	// Output:
	// true
	// no-such-ns/job
}

// Fencing: the generation of each newer lease of a name is larger, so a
// store that remembers the largest it has seen refuses a stale holder.
func ExampleHandleLease_Generation() {
	a, err := client.TryLock(mnt, "ledger")
	if err != nil {
		log.Fatal(err)
	}
	first := a.Generation()
	_ = a.Unlock()
	b, err := client.TryLock(mnt, "ledger")
	if err != nil {
		log.Fatal(err)
	}
	defer b.Unlock()
	fmt.Println(b.Generation() > first)
	// Output: true
}
