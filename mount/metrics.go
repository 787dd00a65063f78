package mount

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"runtime"
	"sync"
	"time"

	"github.com/leasefs/leasefs/fusefs"
	"github.com/leasefs/leasefs/internal/metrics"
	"github.com/leasefs/leasefs/leasecore"
)

// MetricsPath is the HTTP path at which a daemon started with
// [Options.MetricsAddr] serves its Prometheus metrics.
const MetricsPath = "/metrics"

// PprofPath is the HTTP path under which a daemon started with
// [Options.Pprof] serves the Go runtime's profiles (net/http/pprof).
const PprofPath = "/debug/pprof/"

// Sampling of the block and mutex profiles while profiles are served:
// every blocking event of a microsecond or more, and one mutex contention
// event in pprofMutexFraction (runtime.SetBlockProfileRate,
// runtime.SetMutexProfileFraction).
const (
	pprofBlockRate     = int(time.Microsecond)
	pprofMutexFraction = 10
)

// metricsShutdownWait bounds how long stopping waits for scrapes in flight.
const metricsShutdownWait = time.Second

// metricsServer is the HTTP server of a mount's metrics (docs/PROTOCOL.md
// §8b): it listens before the mount, so that a bad address fails the mount,
// and serves once the mount is up. Its methods may be called on a nil
// *metricsServer (no --metrics-addr), where they do nothing. Safe for
// concurrent use.
type metricsServer struct {
	reg  *metrics.Registry
	ln   net.Listener
	srv  *http.Server
	log  *slog.Logger
	once sync.Once
	// profiles: PprofPath is served too.
	profiles bool
}

// listenMetrics opens addr (HOST:PORT; port 0 picks a free one) for a new
// metrics registry, and for the runtime's profiles at PprofPath when
// profiles is set. Errors: the listen error, wrapped, naming addr.
func listenMetrics(addr string, profiles bool, log *slog.Logger) (*metricsServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("mount: cannot serve metrics on %s: %w", addr, err)
	}
	reg := metrics.New(metrics.Options{Logger: log})
	mux := http.NewServeMux()
	mux.Handle(MetricsPath, reg.Handler())
	if profiles {
		runtime.SetBlockProfileRate(pprofBlockRate)
		runtime.SetMutexProfileFraction(pprofMutexFraction)
		mux.HandleFunc(PprofPath, pprof.Index)
		mux.HandleFunc(PprofPath+"cmdline", pprof.Cmdline)
		mux.HandleFunc(PprofPath+"profile", pprof.Profile)
		mux.HandleFunc(PprofPath+"symbol", pprof.Symbol)
		mux.HandleFunc(PprofPath+"trace", pprof.Trace)
	}
	return &metricsServer{
		reg:      reg,
		ln:       ln,
		srv:      &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second},
		log:      log,
		profiles: profiles,
	}, nil
}

// onCommit returns the hook for leasecore.Options.OnCommit, nil without
// metrics.
func (m *metricsServer) onCommit() func(time.Duration) {
	if m == nil {
		return nil
	}
	return m.reg.Committed
}

// instrument counts the events of store and points the hooks of opts at
// the registry.
func (m *metricsServer) instrument(store leasecore.Store, opts *fusefs.Options) {
	if m == nil {
		return
	}
	// The feed, and with it the goroutine that follows it, ends when Run
	// closes the store.
	if err := m.reg.Follow(context.Background(), store); err != nil {
		m.log.Error("metrics cannot follow the lease store", "err", err)
	}
	opts.OnRefuse, opts.OnHandoff = m.reg.Refused, m.reg.LockGranted
}

// serve starts serving on its own goroutine and logs the address, once
// the mount is up.
func (m *metricsServer) serve() {
	if m == nil {
		return
	}
	m.log.Info("serving metrics", "addr", m.ln.Addr().String(), "path", MetricsPath)
	if m.profiles {
		m.log.Info("serving profiles", "addr", m.ln.Addr().String(), "path", PprofPath)
	}
	go func() {
		if err := m.srv.Serve(m.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			m.log.Error("serving metrics failed", "addr", m.ln.Addr().String(), "err", err)
		}
	}()
}

// shutdown stops serving, waiting up to metricsShutdownWait for scrapes in
// flight, and closes the listener. Calls after the first do nothing.
func (m *metricsServer) shutdown() {
	if m == nil {
		return
	}
	m.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), metricsShutdownWait)
		defer cancel()
		if err := m.srv.Shutdown(ctx); err != nil {
			m.log.Warn("stopping the metrics server", "err", err)
		}
		_ = m.ln.Close() // never served: Shutdown did not close it
	})
}
