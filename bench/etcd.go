package main

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// freePort returns a loopback TCP port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// startEtcd starts a one-member etcd in this process on loopback ports with
// its data directory (WAL fsync on, the default) in the temporary
// directory, and returns a client of it.
func (b *bench) startEtcd() (*clientv3.Client, string, error) {
	cport, err := freePort()
	if err != nil {
		return nil, "", err
	}
	pport, err := freePort()
	if err != nil {
		return nil, "", err
	}
	cfg := embed.NewConfig()
	cfg.Name = "bench"
	cfg.Dir = filepath.Join(b.tmp, "etcd")
	curl := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", cport)}
	purl := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", pport)}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{curl}, []url.URL{curl}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{purl}, []url.URL{purl}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.LogLevel = "error"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, "", fmt.Errorf("start etcd: %w", err)
	}
	b.onClose(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(60 * time.Second):
		return nil, "", fmt.Errorf("etcd not ready after 60s")
	case <-b.ctx.Done():
		return nil, "", b.ctx.Err()
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{curl.Host}, DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, "", err
	}
	b.onClose(func() { _ = cli.Close() })
	return cli, curl.Host, nil
}

// etcdRows runs rows 5d (concurrency.Mutex Lock+Unlock on the client's own
// key, against 1a) and 5s (one key shared by every client, against 1d).
// Every client has its own session (one etcd lease, TTL 60 s).
func (b *bench) etcdRows() error {
	mountIDs := map[string]string{"9a": nameEtcdLease, "9b": nameEtcdRenew, "9c": nameEtcdHandle, "9d": nameEtcdQueue}
	if !b.wantAny(map[string]string{"5d": nameEtcdD, "5s": nameEtcdS}) && !b.wantAny(mountIDs) {
		return nil
	}
	b.logf("starting embedded etcd")
	cli, endpoint, err := b.startEtcd()
	if err != nil {
		return err
	}
	mutex := func(shared bool) func(clients, i int) (cycle, func(), error) {
		return func(clients, i int) (cycle, func(), error) {
			sess, err := concurrency.NewSession(cli)
			if err != nil {
				return nil, nil, err
			}
			key := fmt.Sprintf("/bench/distinct/%d/%d", clients, i)
			if shared {
				key = fmt.Sprintf("/bench/shared/%d", clients)
			}
			m := concurrency.NewMutex(sess, key)
			ctx := context.Background()
			return func() error {
					if err := m.Lock(ctx); err != nil {
						return err
					}
					return m.Unlock(ctx)
				}, func() {
					_ = sess.Close()
				}, nil
		}
	}
	if err := b.cellRow("5d", nameEtcdD, mutex(false)); err != nil {
		return err
	}
	if err := b.cellRow("5s", nameEtcdS, mutex(true)); err != nil {
		return err
	}
	if !b.wantAny(mountIDs) {
		return nil
	}
	mp := filepath.Join(b.tmp, "mnt-etcd")
	d, _, err := b.startLeasefs(filepath.Join(b.tmp, "state-etcd"), mp, "--store", "etcd://"+endpoint+"/bench-leasefs")
	if err != nil {
		return err
	}
	defer d.stop()
	b.logf("leasefs on the etcd store mounted on %s (pid %d)", mp, d.pid)
	return b.cycleRows(mp, [4]string{"9a", "9b", "9c", "9d"}, [4]string{nameEtcdLease, nameEtcdRenew, nameEtcdHandle, nameEtcdQueue})
}
