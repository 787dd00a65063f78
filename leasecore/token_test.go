package leasecore

import (
	"encoding/hex"
	"errors"
	"regexp"
	"strings"
	"testing"

	"lukechampine.com/blake3"
)

var (
	leaseIDPattern = regexp.MustCompile(`^lease-[a-z2-7]{39}$`)
	tokenPattern   = regexp.MustCompile(`^hwl_[a-z2-7]{39}$`)
	hashPattern    = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

func TestNewLeaseIDFormat(t *testing.T) {
	t.Parallel()
	seen := make(map[string]bool)
	for range 1000 {
		id := NewLeaseID()
		if !leaseIDPattern.MatchString(id) {
			t.Fatalf("NewLeaseID() = %q, does not match %s", id, leaseIDPattern)
		}
		if err := ValidateLeaseID(id); err != nil {
			t.Fatalf("ValidateLeaseID(NewLeaseID()) = %v", err)
		}
		if seen[id] {
			t.Fatalf("NewLeaseID returned %q twice", id)
		}
		seen[id] = true
		// 39 base32 characters carry the 24 random bytes of docs/PROTOCOL.md §1.
		raw, err := lowerBase32.DecodeString(strings.TrimPrefix(id, LeaseIDPrefix))
		if err != nil || len(raw) != 24 {
			t.Fatalf("id %q decodes to %d bytes (%v), want 24", id, len(raw), err)
		}
	}
}

func TestNewTokenFormat(t *testing.T) {
	t.Parallel()
	seen := make(map[string]bool)
	for range 1000 {
		tok := NewToken()
		if !tokenPattern.MatchString(tok) {
			t.Fatalf("NewToken() = %q, does not match %s", tok, tokenPattern)
		}
		if seen[tok] {
			t.Fatalf("NewToken returned %q twice", tok)
		}
		seen[tok] = true
	}
}

func TestHashToken(t *testing.T) {
	t.Parallel()
	// Known answer: blake3("") from the BLAKE3 test vectors.
	if got, want := HashToken(""), "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"; got != want {
		t.Errorf("HashToken(\"\") = %s, want %s", got, want)
	}
	for range 20 {
		tok := NewToken()
		got := HashToken(tok)
		if !hashPattern.MatchString(got) {
			t.Fatalf("HashToken(%q) = %q, not 64 lowercase hex characters", tok, got)
		}
		sum := blake3.Sum256([]byte(tok))
		if want := hex.EncodeToString(sum[:]); got != want {
			t.Fatalf("HashToken(%q) = %s, want blake3 %s", tok, got, want)
		}
		if strings.Contains(got, strings.TrimPrefix(tok, TokenPrefix)) {
			t.Fatalf("hash %s contains the token", got)
		}
	}
}

func TestTokenMatches(t *testing.T) {
	t.Parallel()
	tok := NewToken()
	hash := HashToken(tok)
	tests := []struct {
		name  string
		token string
		hash  string
		want  bool
	}{
		{"right token", tok, hash, true},
		{"other token", NewToken(), hash, false},
		{"token with newline", tok + "\n", hash, false},
		{"empty token", "", hash, false},
		{"empty hash", tok, "", false},
		{"upper-case hash", tok, strings.ToUpper(hash), false},
		{"truncated hash", tok, hash[:63], false},
		{"the hash presented as token", hash, hash, false},
	}
	for _, tc := range tests {
		if got := TokenMatches(tc.token, tc.hash); got != tc.want {
			t.Errorf("%s: TokenMatches = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestValidateLeaseID(t *testing.T) {
	t.Parallel()
	tests := []struct {
		id string
		ok bool
	}{
		{NewLeaseID(), true},
		{"lease-abc", true},
		{"lease-a-b-0", true}, // the reference store accepts digits and dashes
		{"../x", false},
		{"lease-", false},
		{"LEASE-a", false},
		{"lease-A", false},
		{"lease-a/b", false},
		{"lease-../x", false},
		{"lease-a.toml", false},
		{"lease-a\x00", false},
		{"", false},
		{"lease_abc", false},
		{"xlease-abc", false},
		{"lease-" + strings.Repeat("a", 200), false},
	}
	for _, tc := range tests {
		err := ValidateLeaseID(tc.id)
		if tc.ok && err != nil {
			t.Errorf("ValidateLeaseID(%q) = %v, want nil", tc.id, err)
		}
		if !tc.ok && !errors.Is(err, ErrInvalidID) {
			t.Errorf("ValidateLeaseID(%q) = %v, want ErrInvalidID", tc.id, err)
		}
	}
}

func TestValidateName(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   string
		want error // nil: valid
	}{
		{"plain", "feature-a", nil},
		{"unicode", "fünf-日本", nil},
		{"spaces and dots", "a b.c", nil},
		{"dot prefix", ".hidden", nil},
		{"255 bytes", strings.Repeat("x", 255), nil},
		{"255 bytes multibyte", strings.Repeat("é", 127) + "x", nil},
		{"256 bytes", strings.Repeat("x", 256), ErrNameTooLong},
		{"256 bytes multibyte", strings.Repeat("é", 128), ErrNameTooLong},
		{"empty", "", ErrInvalidName},
		{"dot", ".", ErrInvalidName},
		{"dotdot", "..", ErrInvalidName},
		{"slash", "a/b", ErrInvalidName},
		{"dotdot path", "a/../b", ErrInvalidName},
		{"NUL", "a\x00b", ErrInvalidName},
		{"invalid UTF-8", "a\xffb", ErrInvalidName},
		{"truncated UTF-8", "\xc3", ErrInvalidName},
	}
	for _, tc := range tests {
		err := ValidateName(tc.in)
		switch {
		case tc.want == nil && err != nil:
			t.Errorf("%s: ValidateName = %v, want nil", tc.name, err)
		case tc.want != nil && !errors.Is(err, tc.want):
			t.Errorf("%s: ValidateName = %v, want %v", tc.name, err, tc.want)
		}
	}
}

func TestValidateResource(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", 255)
	tests := []struct {
		name string
		in   string
		want error // nil: valid
	}{
		{"single", "feature", nil},
		{"nested", "feature/a", nil},
		{"deep", "a/b/c/d", nil},
		{"255-byte components", long + "/" + long, nil},
		{"256-byte component", "a/" + long + "x", ErrNameTooLong},
		{"empty", "", ErrInvalidName},
		{"dot", ".", ErrInvalidName},
		{"dotdot", "..", ErrInvalidName},
		{"dotdot component", "a/../b", ErrInvalidName},
		{"dot component", "a/./b", ErrInvalidName},
		{"leading slash", "/a", ErrInvalidName},
		{"trailing slash", "a/", ErrInvalidName},
		{"double slash", "a//b", ErrInvalidName},
		{"NUL", "a/b\x00", ErrInvalidName},
		{"invalid UTF-8", "a/\xff", ErrInvalidName},
		{"over 4096 bytes", strings.Repeat(long+"/", 16) + long, ErrNameTooLong},
	}
	for _, tc := range tests {
		err := ValidateResource(tc.in)
		switch {
		case tc.want == nil && err != nil:
			t.Errorf("%s: ValidateResource = %v, want nil", tc.name, err)
		case tc.want != nil && !errors.Is(err, tc.want):
			t.Errorf("%s: ValidateResource = %v, want %v", tc.name, err, tc.want)
		}
	}
}

func TestParentOf(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"a":     "",
		"a/b":   "a",
		"a/b/c": "a/b",
	} {
		if got := ParentOf(in); got != want {
			t.Errorf("ParentOf(%q) = %q, want %q", in, got, want)
		}
	}
}
