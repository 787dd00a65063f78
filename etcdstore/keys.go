package etcdstore

import (
	"strconv"
	"strings"
)

// keys builds the etcd keys of one store under its prefix (docs/PROTOCOL.md
// §8a, "etcd store"). Every key starts with the prefix, which ends in "/":
//
//	PREFIX/live/<resource>             record of the live lease on resource (TOML, §4.3), bound to its etcd lease
//	PREFIX/ids/<lease-id>              resource of a live lease, bound to its etcd lease
//	PREFIX/holders/<uid>/<resource>    lease id, one per live lease of uid (the §7 quota), bound to its etcd lease
//	PREFIX/history/<lease-id>          record of an ended lease, pruned to HistoryKeep
//	PREFIX/ns/<path>                   namespace (JSON: uid, gid, created_at)
//	PREFIX/nsuid/<uid>/<path>          one per namespace created by uid (the quota on namespaces)
//	PREFIX/waiters/<resource>//<id>    one per blocked Acquire, bound to its daemon's session lease
//	PREFIX/daemons/<host>/<daemon-id>//session     the id of the daemon's handle session, bound to it
//	PREFIX/daemons/<host>/<daemon-id>//bucket/<id>  one per token lease bucket of the daemon, bound to it
//
// The daemon keys let the next daemon of an identity find the leases of
// the previous one (on those etcd leases) without reading the prefix.
//
// A resource never contains "//" (no empty components, docs/PROTOCOL.md
// §3), so the waiters of one resource are exactly the keys under
// "PREFIX/waiters/<resource>//".
type keys string

func (p keys) live(resource string) string { return string(p) + "live/" + resource }
func (p keys) livePrefix(dir string) string {
	if dir == "" {
		return string(p) + "live/"
	}
	return string(p) + "live/" + dir + "/"
}
func (p keys) id(id string) string      { return string(p) + "ids/" + id }
func (p keys) history(id string) string { return string(p) + "history/" + id }
func (p keys) historyPrefix() string    { return string(p) + "history/" }
func (p keys) ns(path string) string    { return string(p) + "ns/" + path }
func (p keys) waiters(resource string) string {
	return string(p) + "waiters/" + resource + "//"
}
func (p keys) waitersAll() string { return string(p) + "waiters/" }
func (p keys) daemon(host, id string) string {
	return string(p) + "daemons/" + host + "/" + id + "//"
}
func (p keys) daemonSession(host, id string) string { return p.daemon(host, id) + "session" }
func (p keys) daemonBucket(host, id string, lid int64) string {
	return p.daemon(host, id) + "bucket/" + strconv.FormatInt(lid, 10)
}
func (p keys) nsPrefix(dir string) string {
	if dir == "" {
		return string(p) + "ns/"
	}
	return string(p) + "ns/" + dir + "/"
}
func (p keys) holders(uid uint32) string {
	return string(p) + "holders/" + strconv.FormatUint(uint64(uid), 10) + "/"
}
func (p keys) holder(uid uint32, resource string) string { return p.holders(uid) + resource }
func (p keys) nsOwners(uid uint32) string {
	return string(p) + "nsuid/" + strconv.FormatUint(uint64(uid), 10) + "/"
}
func (p keys) nsOwner(uid uint32, path string) string { return p.nsOwners(uid) + path }

// classify splits key into its kind ("live", "history", "waiters", …) and
// the rest: the resource of live keys and waiter keys, the lease id of
// history keys.
func (p keys) classify(key string) (kind, rest string) {
	k, ok := strings.CutPrefix(key, string(p))
	if !ok {
		return "", ""
	}
	kind, rest, _ = strings.Cut(k, "/")
	if kind == "waiters" {
		rest, _, _ = strings.Cut(rest, "//")
	}
	return kind, rest
}
