// Package idempotency maps a client's Idempotency-Key to the one request
// it started, per caller (tenant and user), for a retention window: a retried POST attaches
// to that request instead of starting (and paying for) another.
package idempotency

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed lua/release.lua
	releaseLua    string
	releaseScript = redis.NewScript(releaseLua)
)

// MaxKeyLength bounds a client's key, as Stripe's and the IETF draft's
// examples do; longer keys are refused, not truncated.
const MaxKeyLength = 255

// ErrBadKey is the error of a key that is empty, too long or not visible
// ASCII.
var ErrBadKey = errors.New("idempotency key must be 1-255 visible ASCII characters")

// Store keeps the claims in Redis.
type Store struct {
	rdb    redis.UniversalClient
	prefix string
	ttl    time.Duration
}

// New returns a Store whose claims live for ttl.
func New(rdb redis.UniversalClient, keyPrefix string, ttl time.Duration) *Store {
	return &Store{rdb: rdb, prefix: keyPrefix, ttl: ttl}
}

// Key is one client key of one tenant, with the fingerprint of the
// request it came with.
type Key struct {
	redisKey    string
	fingerprint string
}

// Claim is the request a key is held by.
type Claim struct {
	RequestID string
	// Same reports whether the request was sent with the same body.
	Same bool
}

// Fingerprint is the digest a request's canonical form is compared by.
func Fingerprint(parts ...[]byte) string {
	h := sha256.New()
	for _, p := range parts {
		// Length-prefixed, so that moving bytes between parts changes it.
		fmt.Fprintf(h, "%d:", len(p))
		h.Write(p)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// KeyFor is the key clientKey of one caller (a tenant's user) for a
// request whose canonical form has the fingerprint: each caller's keys are
// its own, as its requests are. The client's key is stored hashed with
// its owner: it may be anything the client chose, and its length is
// bounded either way.
func (s *Store) KeyFor(tenant, user, clientKey, fingerprint string) (Key, error) {
	if clientKey == "" || len(clientKey) > MaxKeyLength || strings.IndexFunc(clientKey, notVisibleASCII) >= 0 {
		return Key{}, ErrBadKey
	}
	sum := sha256.Sum256([]byte(tenant + "\x00" + user + "\x00" + clientKey))
	return Key{redisKey: s.prefix + "idem:" + hex.EncodeToString(sum[:]), fingerprint: fingerprint}, nil
}

func notVisibleASCII(r rune) bool { return r < 0x21 || r > 0x7e }

// Lookup returns the claim on k, if any.
func (s *Store) Lookup(ctx context.Context, k Key) (Claim, bool, error) {
	v, err := s.rdb.Get(ctx, k.redisKey).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return Claim{}, false, nil
	case err != nil:
		return Claim{}, false, fmt.Errorf("look up idempotency key: %w", err)
	}
	return k.claimOf(v), true, nil
}

// Claim makes requestID the holder of k unless another request holds it,
// in one step: of two requests that race with one key, one starts and the
// other gets the winner's claim (won false).
func (s *Store) Claim(ctx context.Context, k Key, requestID string) (Claim, bool, error) {
	old, err := s.rdb.SetArgs(ctx, k.redisKey, k.value(requestID), redis.SetArgs{Mode: "NX", Get: true, TTL: s.ttl}).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return Claim{RequestID: requestID, Same: true}, true, nil
	case err != nil:
		return Claim{}, false, fmt.Errorf("claim idempotency key: %w", err)
	}
	return k.claimOf(old), false, nil
}

// Release gives k back if requestID still holds it: a request that could
// not be started leaves its key for the client's retry.
func (s *Store) Release(ctx context.Context, k Key, requestID string) error {
	if err := releaseScript.Run(ctx, s.rdb, []string{k.redisKey}, k.value(requestID)).Err(); err != nil {
		return fmt.Errorf("release idempotency key: %w", err)
	}
	return nil
}

func (k Key) value(requestID string) string { return requestID + " " + k.fingerprint }

func (k Key) claimOf(v string) Claim {
	id, fp, _ := strings.Cut(v, " ")
	return Claim{RequestID: id, Same: fp == k.fingerprint}
}
