// Package cli is the leasefs command line: the cobra commands (a file per
// command: root.go, mountcmd.go, lscmd.go, statuscmd.go, lockcmd.go,
// completion.go, mancmd.go), the tables of ls and history (table.go), the
// choice of a daemon (target.go, docs/PROTOCOL.md §8, "Which daemon") and of
// a store (storeflag.go), the mount.fuse3 helper form (mounthelper.go) and
// systemd readiness (notify.go). Package main calls [Run] and nothing else.
package cli
