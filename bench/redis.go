package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// ensureRedis returns the path of redis-server, installing Debian's
// package when it is missing (saying so on stderr).
func (b *bench) ensureRedis() (string, error) {
	if p, err := exec.LookPath("redis-server"); err == nil {
		return p, nil
	}
	b.logf("redis-server is missing: running apt-get update && apt-get install -y redis-server")
	for _, args := range [][]string{{"update"}, {"install", "-y", "redis-server"}} {
		cmd := exec.CommandContext(b.ctx, "apt-get", args...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		cmd.Stdout, cmd.Stderr = b.log, b.log
		if err := cmd.Run(); err != nil {
			return "", fmt.Errorf("apt-get %v: %w", args, err)
		}
	}
	// The package starts a system instance on port 6379; ours use their own ports.
	return exec.LookPath("redis-server")
}

// startRedis starts a private redis-server on a loopback port with an
// append-only file fsynced per fsyncPolicy ("always", "everysec") and no
// snapshots, in the foreground, and returns a client with a pool for 64
// clients.
func (b *bench) startRedis(bin, fsyncPolicy string) (*redis.Client, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(b.tmp, "redis-"+fsyncPolicy)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
		"--appendonly", "yes", "--appendfsync", fsyncPolicy, "--save", "", "--daemonize", "no",
		"--protected-mode", "yes", "--logfile", "")
	c, err := b.spawn("redis-server "+fsyncPolicy, "", cmd)
	if err != nil {
		return nil, err
	}
	rdb := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port), PoolSize: 80, MinIdleConns: 64})
	b.onClose(func() { _ = rdb.Close() })
	deadline := time.Now().Add(15 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(b.ctx, time.Second)
		err := rdb.Ping(ctx).Err()
		cancel()
		if err == nil {
			return rdb, nil
		}
		select {
		case <-c.exited:
			return nil, fmt.Errorf("redis-server exited: %s", c.log())
		default:
		}
		if time.Now().After(deadline) || b.ctx.Err() != nil {
			return nil, fmt.Errorf("redis-server on port %d not answering: %v; log:\n%s", port, err, c.log())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// redisRows runs rows 6a and 6e: SET key val NX PX 30000 then DEL of the
// client's own key, against redis-server with appendfsync always and
// everysec.
func (b *bench) redisRows() error {
	rows := []struct{ id, name, policy string }{{"6a", nameRedisA, "always"}, {"6e", nameRedisE, "everysec"}}
	if !b.wantAny(map[string]string{"6a": nameRedisA, "6e": nameRedisE}) {
		return nil
	}
	bin, err := b.ensureRedis()
	if err != nil {
		return err
	}
	for _, r := range rows {
		if !b.want(r.id, r.name) {
			continue
		}
		rdb, err := b.startRedis(bin, r.policy)
		if err != nil {
			return err
		}
		ctx := context.Background()
		err = b.cellRow(r.id, r.name, func(clients, i int) (cycle, func(), error) {
			key := fmt.Sprintf("lease:%d:%d", clients, i)
			return func() error {
				ok, err := rdb.Do(ctx, "SET", key, "holder", "NX", "PX", 30000).Result()
				if err != nil {
					return fmt.Errorf("SET NX: %w", err)
				}
				if ok != "OK" {
					return fmt.Errorf("SET NX: %v", ok)
				}
				return rdb.Del(ctx, key).Err()
			}, nil, nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}
