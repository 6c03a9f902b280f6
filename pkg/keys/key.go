package keys

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"
)

// A managed key reads sk_<id>_<secret>. The id is public: it names the
// key in lists, logs and bans and finds its record without a scan. The
// secret is 256 random bits, so one SHA-256 of the whole key is a safe
// verifier (a slow password hash only helps low-entropy secrets).
const (
	prefix      = "sk_"
	idBytes     = 8  // 64 bits: ids are drawn at random, collisions retried
	idLen       = 12 // characters of the id kept (60 bits)
	secretBytes = 32
)

// b32 is lower-case base32 without padding: no '_' (the separator), no
// characters a URL or a shell would mangle.
var b32 = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

var idPattern = regexp.MustCompile(`^[a-z2-7]{12}$`)

// ErrMalformed is a string that is not a managed key.
var ErrMalformed = errors.New("not a managed key (sk_<id>_<secret>)")

// Key is a managed key's record: everything but its secret.
type Key struct {
	ID     string `json:"id"`
	Tenant string `json:"tenant"`
	// User is who in the tenant holds the key; "" is the tenant itself.
	User string `json:"user,omitempty"`
	// Tier names a limits tier; "" is limits.default_tier.
	Tier      string    `json:"tier,omitempty"`
	Scopes    Scopes    `json:"scopes"`
	CreatedAt time.Time `json:"created_at"`
	// LastUsedAt is written at most once a minute per key and process, so
	// it may trail the last request by that much; zero if never used.
	LastUsedAt time.Time `json:"last_used_at,omitzero"`
	Revoked    bool      `json:"revoked"`
	RevokedAt  time.Time `json:"revoked_at,omitzero"`
	// hash is the hex SHA-256 of the whole plain key.
	hash string
}

// Masked is how the key is shown once created: its id, never its secret.
func (k Key) Masked() string { return Mask(k.ID) }

// Mask shows a key id the way a key is displayed after creation.
func Mask(id string) string { return prefix + id + "_…" }

// Hash is the hex SHA-256 of a plain key: what Sluice stores and compares,
// for managed keys and for auth.api_keys alike.
func Hash(plain string) string {
	sum := sha256.Sum256([]byte(plain))
	return hex.EncodeToString(sum[:])
}

// ParseID returns the id of a managed key, checking only its shape.
func ParseID(plain string) (string, error) {
	rest, ok := strings.CutPrefix(plain, prefix)
	if !ok {
		return "", ErrMalformed
	}
	id, secret, ok := strings.Cut(rest, "_")
	if !ok || !idPattern.MatchString(id) || len(secret) != b32.EncodedLen(secretBytes) {
		return "", ErrMalformed
	}
	return id, nil
}

// ValidID reports whether id has the shape of a managed key's id.
func ValidID(id string) bool { return idPattern.MatchString(id) }

// generate draws a new id and plain key.
func generate() (id, plain string, err error) {
	raw := make([]byte, idBytes+secretBytes)
	if _, err := rand.Read(raw); err != nil {
		return "", "", fmt.Errorf("draw a key: %w", err)
	}
	id = b32.EncodeToString(raw[:idBytes])[:idLen]
	return id, prefix + id + "_" + b32.EncodeToString(raw[idBytes:]), nil
}
