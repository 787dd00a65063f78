package cli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/leasefs/leasefs/etcdstore"
	"github.com/leasefs/leasefs/internal/procfs"
	"github.com/leasefs/leasefs/leasecore"
	"github.com/leasefs/leasefs/mount"
)

// etcdPasswordEnv names the environment variable that holds the etcd
// password when --etcd-user gives none.
const etcdPasswordEnv = "LEASEFS_ETCD_PASSWORD"

// storeFlags are the flags that choose the lease store (docs/PROTOCOL.md
// §8a): "file" (the state directory) or an etcd cluster.
type storeFlags struct {
	store             string
	cacert, cert, key string
	user              string
}

// add registers --store and the --etcd-* flags on f.
func (sf *storeFlags) add(f *pflag.FlagSet) {
	f.StringVar(&sf.store, "store", "file", "where leases live: file (the --state directory) or etcd://HOST:PORT[,HOST:PORT...]/PREFIX")
	f.StringVar(&sf.cacert, "etcd-cacert", "", "PEM file of the CA that signs the etcd servers' certificates (TLS)")
	f.StringVar(&sf.cert, "etcd-cert", "", "PEM client certificate for etcd (TLS; with --etcd-key)")
	f.StringVar(&sf.key, "etcd-key", "", "PEM key of --etcd-cert")
	f.StringVar(&sf.user, "etcd-user", "", "etcd user, as USER (password from $"+etcdPasswordEnv+") or USER:PASSWORD")
}

// etcdSpec is a parsed etcd:// store.
type etcdSpec struct {
	endpoints []string
	prefix    string
}

// parse returns the etcd store named by --store, or nil for the file
// store. Errors: a usage error for a malformed --store.
func (sf *storeFlags) parse() (*etcdSpec, error) {
	if sf.store == "" {
		return nil, usageError{errors.New(`--store "": want file or etcd://HOST:PORT[,HOST:PORT...]/PREFIX`)}
	}
	if sf.store == "file" {
		if sf.cacert != "" || sf.cert != "" || sf.key != "" || sf.user != "" {
			return nil, usageError{errors.New("the --etcd-* flags need an etcd:// --store")}
		}
		return nil, nil
	}
	rest, ok := strings.CutPrefix(sf.store, "etcd://")
	if !ok {
		return nil, usageError{fmt.Errorf("--store %q: want file or etcd://HOST:PORT[,HOST:PORT...]/PREFIX", sf.store)}
	}
	hosts, prefix, _ := strings.Cut(rest, "/")
	if strings.Trim(prefix, "/") == "" {
		return nil, usageError{fmt.Errorf("--store %q: a key PREFIX is required after the endpoints, e.g. etcd://127.0.0.1:2379/leasefs", sf.store)}
	}
	spec := &etcdSpec{prefix: "/" + strings.Trim(prefix, "/")}
	for h := range strings.SplitSeq(hosts, ",") {
		host, port, err := net.SplitHostPort(h)
		if err == nil && host == "" {
			err = errors.New("no host")
		}
		if n, perr := strconv.Atoi(port); err == nil && (perr != nil || n < 1 || n > 65535) {
			err = errors.New("the port is not a number from 1 to 65535")
		}
		if err != nil {
			return nil, usageError{fmt.Errorf("--store %q: endpoint %q: want HOST:PORT (%v)", sf.store, h, err)}
		}
		spec.endpoints = append(spec.endpoints, h)
	}
	return spec, nil
}

// options returns the TLS and authentication options of the etcd flags.
// Errors: unreadable or invalid certificate files; a usage error for a
// certificate without its key.
func (sf *storeFlags) options() (etcdstore.Options, error) {
	var o etcdstore.Options
	if sf.user != "" {
		user, pass, ok := strings.Cut(sf.user, ":")
		if !ok {
			pass = os.Getenv(etcdPasswordEnv)
		}
		o.Username, o.Password = user, pass
	}
	if (sf.cert == "") != (sf.key == "") {
		return o, usageError{errors.New("--etcd-cert and --etcd-key go together")}
	}
	if sf.cacert == "" && sf.cert == "" {
		return o, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if sf.cacert != "" {
		pem, err := os.ReadFile(sf.cacert)
		if err != nil {
			return o, fmt.Errorf("--etcd-cacert: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return o, fmt.Errorf("--etcd-cacert %s: no PEM certificate in it", sf.cacert)
		}
	}
	if sf.cert != "" {
		pair, err := tls.LoadX509KeyPair(sf.cert, sf.key)
		if err != nil {
			return o, fmt.Errorf("--etcd-cert/--etcd-key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	o.TLS = cfg
	return o, nil
}

// storeOpener is the one place that picks the store a mount serves: the
// etcd store that spec names (--store etcd://…, see [etcdOpener]), or,
// when spec is nil, the embedded file store in opts.StateDir
// ([mount.FileStoreOpener]). It sets opts.StoreName for the daemon lock.
func storeOpener(spec *etcdSpec, sf *storeFlags, opts *mount.Options, grace time.Duration) (func(context.Context, *slog.Logger, mount.StoreHooks) (leasecore.Store, error), error) {
	if spec == nil {
		opts.StoreName = ""
		return mount.FileStoreOpener(*opts), nil
	}
	opts.StoreName = sf.store
	return etcdOpener(spec, sf, opts, grace)
}

// etcdOpener returns the [mount.Options.OpenStore] of an etcd store for
// the daemon serving state: its daemon identity is the host and the
// absolute state directory, so that a restarted daemon ends only the
// handle leases it left (docs/PROTOCOL.md §8a). Its handle leases have a
// grace period of grace (§8a, "Elections and jeopardy"), and the count of
// those in jeopardy is recorded in state for "leasefs status"
// ([writeJeopardy]).
func etcdOpener(spec *etcdSpec, sf *storeFlags, opts *mount.Options, grace time.Duration) (func(context.Context, *slog.Logger, mount.StoreHooks) (leasecore.Store, error), error) {
	eo, err := sf.options()
	if err != nil {
		return nil, err
	}
	state, err := filepath.Abs(opts.StateDir)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, log *slog.Logger, hooks mount.StoreHooks) (leasecore.Store, error) {
		o := eo
		o.LeaseDuration, o.HistoryKeep, o.MaxLeasesPerUID = opts.LeaseDuration, opts.HistoryKeep, opts.MaxLeasesPerUID
		o.Logger, o.OnCommit, o.HandleHolders = log, hooks.OnCommit, hooks.HandleHolders
		o.KernelKnows = hooks.KernelKnows
		o.Host, o.DaemonID = daemonIdentity(state)
		o.Grace = grace
		o.OnJeopardy = func(n int) { writeJeopardy(log, state, n) }
		writeJeopardy(log, state, 0)
		s, err := etcdstore.Open(ctx, spec.endpoints, spec.prefix, o)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", sf.store, err)
		}
		log.Info("serving the etcd store", "endpoints", strings.Join(spec.endpoints, ","), "prefix", spec.prefix)
		return s, nil
	}, nil
}

// daemonIdentity returns this host's name and the etcd daemon identity of
// the daemon serving the absolute state directory state: "HOST:STATE", so
// that a restarted daemon ends only the handle leases it left
// (docs/PROTOCOL.md §8a).
func daemonIdentity(state string) (host, id string) {
	host = procfs.Hostname()
	return host, host + ":" + state
}

// openForReading opens the store of the flags for "leasefs ls" and
// "history": the file store in state read-only, or the etcd store
// read-only (no reaper, no writes).
func openForReading(ctx context.Context, state string, sf *storeFlags, stderr io.Writer) (leasecore.Store, error) {
	spec, err := sf.parse()
	if err != nil {
		return nil, err
	}
	if spec == nil {
		s, err := openReadOnly(state, stderr)
		if err != nil {
			return nil, storeError(state, err)
		}
		return s, nil
	}
	o, err := sf.options()
	if err != nil {
		return nil, err
	}
	o.ReadOnly = true
	o.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	// The daemon identity of the mount of state (etcdOpener), so that the
	// handle leases held through its previous daemon's mount show as such
	// (docs/PROTOCOL.md §2).
	abs, err := filepath.Abs(state)
	if err != nil {
		return nil, err
	}
	o.Host, o.DaemonID = daemonIdentity(abs)
	o.HandleHolders = mount.HandleHolders(abs)
	s, err := etcdstore.Open(ctx, spec.endpoints, spec.prefix, o)
	if err != nil {
		return nil, fmt.Errorf("cannot read the lease store %s: %w", sf.store, err)
	}
	return s, nil
}
