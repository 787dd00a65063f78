#!/usr/bin/env bash
# Every test of leasefs (CONTRIBUTING.md, "Running the tests"): the whole
# module with the race detector, including the FUSE integration tests and
# the reliability suite in its CI form (-short: 15 s of chaos, 10 daemon
# crashes, 5 s per fuzz target), then the bench module's tests, then the
# integration suite on the etcd store of a separately installed etcd server
# (Debian's etcd-server).
set -euo pipefail
cd "$(dirname "$0")"
go test -race -count=1 -short -timeout 25m ./...
(cd bench && go test -race -count=1 -timeout 10m ./...)
LEASEFS_TEST_STORE=etcd-server go test -race -count=1 -timeout 15m -skip 'Reliability|Scale|Etcd|Bench' ./integration/
