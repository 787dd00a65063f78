package leasecore

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base32"
	"encoding/hex"
	"fmt"
	"strings"
	"unicode/utf8"

	"lukechampine.com/blake3"
)

// Prefixes of lease ids and tokens (docs/PROTOCOL.md §1).
const (
	LeaseIDPrefix = "lease-"
	TokenPrefix   = "hwl_"
	// randomBytes is the entropy of ids and tokens: 24 bytes from crypto/rand,
	// 39 characters of unpadded base32.
	randomBytes = 24
	encodedLen  = 39
	// MaxNameLen is the longest name component in bytes (docs/PROTOCOL.md §3).
	MaxNameLen = 255
)

var lowerBase32 = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

func randomBase32() string {
	var b [randomBytes]byte
	// crypto/rand.Read never returns an error on Linux (Go 1.24+); it
	// crashes the program rather than return weak randomness.
	_, _ = rand.Read(b[:])
	return lowerBase32.EncodeToString(b[:])
}

// NewLeaseID returns a fresh lease id: "lease-" and 39 lowercase base32
// characters from 24 random bytes (docs/PROTOCOL.md §1). Safe for concurrent use.
func NewLeaseID() string { return LeaseIDPrefix + randomBase32() }

// NewToken returns a fresh bearer token: "hwl_" and 39 lowercase base32
// characters from 24 random bytes (docs/PROTOCOL.md §1). Safe for concurrent use.
func NewToken() string { return TokenPrefix + randomBase32() }

// HashToken returns the blake3-256 hex digest (64 lowercase hex characters)
// of token: the only form in which a token is stored (docs/PROTOCOL.md §1, §4.3).
func HashToken(token string) string {
	sum := blake3.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// TokenMatches reports whether token hashes to hash, comparing the digests in
// constant time (docs/PROTOCOL.md §7).
func TokenMatches(token, hash string) bool {
	got := HashToken(token)
	return subtle.ConstantTimeCompare([]byte(got), []byte(hash)) == 1
}

// ValidateLeaseID checks that id is "lease-" followed by lowercase letters,
// digits and dashes only, as the reference store requires, before any path
// is built from it. It returns an error wrapping [ErrInvalidID].
func ValidateLeaseID(id string) error {
	rest, ok := strings.CutPrefix(id, LeaseIDPrefix)
	if !ok || rest == "" || len(id) > 128 {
		return fmt.Errorf("%w: %q", ErrInvalidID, id)
	}
	for i := 0; i < len(rest); i++ {
		c := rest[i]
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			return fmt.Errorf("%w: %q", ErrInvalidID, id)
		}
	}
	return nil
}

// ValidateName checks one path component (docs/PROTOCOL.md §3): 1–255 bytes of valid
// UTF-8 without NUL or "/", and not "." or "..". It returns an error wrapping
// [ErrNameTooLong] or [ErrInvalidName].
func ValidateName(name string) error {
	switch {
	case len(name) > MaxNameLen:
		return fmt.Errorf("%w: %d bytes", ErrNameTooLong, len(name))
	case name == "" || name == "." || name == "..":
		return fmt.Errorf("%w: %q", ErrInvalidName, name)
	case !utf8.ValidString(name):
		return fmt.Errorf("%w: not valid UTF-8", ErrInvalidName)
	case strings.ContainsAny(name, "/\x00"):
		return fmt.Errorf("%w: %q contains NUL or /", ErrInvalidName, name)
	}
	return nil
}

// ValidateResource checks a resource path: one or more components separated
// by single slashes, each valid under [ValidateName], at most 4096 bytes in
// all. It returns an error wrapping [ErrNameTooLong] or [ErrInvalidName].
func ValidateResource(resource string) error {
	switch {
	case resource == "":
		return fmt.Errorf("%w: empty resource", ErrInvalidName)
	case len(resource) > 4096:
		return fmt.Errorf("%w: resource of %d bytes", ErrNameTooLong, len(resource))
	}
	for part := range strings.SplitSeq(resource, "/") {
		if err := ValidateName(part); err != nil {
			return err
		}
	}
	return nil
}

// ParentOf returns the namespace that contains resource ("" for the root).
func ParentOf(resource string) string {
	if i := strings.LastIndexByte(resource, '/'); i >= 0 {
		return resource[:i]
	}
	return ""
}
