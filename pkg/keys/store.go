package keys

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed lua/create.lua
	createLua string
	//go:embed lua/revoke.lua
	revokeLua string

	createScript = redis.NewScript(createLua)
	revokeScript = redis.NewScript(revokeLua)
)

// Store keeps managed keys in Redis: one hash per key (never its secret,
// only the SHA-256 of the whole key), a set of every id for listing, and
// one hash of last-used times.
type Store struct {
	rdb    redis.UniversalClient
	prefix string
}

// NewStore returns a Store whose keys start with keyPrefix (redis.key_prefix).
func NewStore(rdb redis.UniversalClient, keyPrefix string) *Store {
	return &Store{rdb: rdb, prefix: keyPrefix}
}

// Key layout: a record per key, and two keys over all of them. No script
// or transaction names more than one of them, so they need no hash tag.
//
//	<prefix>key:<id>     hash: the record (hash, tenant, user, tier, scopes,
//	                     created, revoked)
//	<prefix>keys         set of every id, for List
//	<prefix>keys:used    hash id -> last use (ms)
func (s *Store) recordKey(id string) string { return s.prefix + "key:" + id }
func (s *Store) idsKey() string             { return s.prefix + "keys" }
func (s *Store) usedKey() string            { return s.prefix + "keys:used" }

// Channel is where a revocation is announced (the payload is the id).
func (s *Store) Channel() string { return s.prefix + "keys:changed" }

// Spec is what a new key names and grants.
type Spec struct {
	Tenant, User, Tier string
	Scopes             Scopes
}

// namePattern bounds tenant and user names: they appear in Redis keys,
// logs and Temporal search attributes.
var namePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$`)

// ErrInvalid wraps every reason a Spec is refused.
var ErrInvalid = errors.New("invalid key spec")

// Check validates a spec; the tier is the caller's to check (the store
// does not know the limits).
func (sp Spec) Check() error {
	if !namePattern.MatchString(sp.Tenant) {
		return fmt.Errorf("%w: tenant must be 1-64 letters, digits, '.', '_', '@' or '-', got %q", ErrInvalid, sp.Tenant)
	}
	if sp.User != "" && !namePattern.MatchString(sp.User) {
		return fmt.Errorf("%w: user must be 1-64 letters, digits, '.', '_', '@' or '-', got %q", ErrInvalid, sp.User)
	}
	if len(sp.Scopes) == 0 {
		return fmt.Errorf("%w: scopes must name at least one of %s", ErrInvalid, Scopes(AllScopes))
	}
	if _, err := ParseScopes(strings.Split(sp.Scopes.String(), ",")); err != nil {
		return fmt.Errorf("%w: scopes: %v", ErrInvalid, err)
	}
	return nil
}

// Create stores a new key and returns it in plain text: the only time it
// exists outside its holder's hands.
func (s *Store) Create(ctx context.Context, sp Spec) (string, Key, error) {
	if err := sp.Check(); err != nil {
		return "", Key{}, err
	}
	for range 3 {
		id, plain, err := generate()
		if err != nil {
			return "", Key{}, err
		}
		hash := Hash(plain)
		// Listed first: an id listed without a record (the create failed,
		// or the id was taken, so it is listed already) is skipped by
		// List, while a record that no list names could not be found.
		if err := s.rdb.SAdd(ctx, s.idsKey(), id).Err(); err != nil {
			return "", Key{}, fmt.Errorf("create key for tenant %s: list its id: %w", sp.Tenant, err)
		}
		created, err := createScript.Run(ctx, s.rdb, []string{s.recordKey(id)},
			id, hash, sp.Tenant, sp.User, sp.Tier, sp.Scopes.String()).Int64()
		if err != nil {
			return "", Key{}, fmt.Errorf("create key for tenant %s: %w", sp.Tenant, err)
		}
		if created == 0 {
			continue // the id is taken: draw another
		}
		return plain, Key{ID: id, Tenant: sp.Tenant, User: sp.User, Tier: sp.Tier, Scopes: sp.Scopes,
			CreatedAt: time.UnixMilli(created).UTC(), hash: hash}, nil
	}
	return "", Key{}, errors.New("create key: three random ids were all taken")
}

// Get reads a key's record; false if there is none.
func (s *Store) Get(ctx context.Context, id string) (Key, bool, error) {
	fields, err := s.rdb.HGetAll(ctx, s.recordKey(id)).Result()
	if err != nil {
		return Key{}, false, fmt.Errorf("read key %s: %w", id, err)
	}
	if len(fields) == 0 {
		return Key{}, false, nil
	}
	k, err := decode(id, fields)
	return k, err == nil, err
}

func decode(id string, f map[string]string) (Key, error) {
	k := Key{ID: id, Tenant: f["tenant"], User: f["user"], Tier: f["tier"], hash: f["hash"]}
	if f["scopes"] != "" {
		sc, err := ParseScopes(strings.Split(f["scopes"], ","))
		if err != nil {
			return Key{}, fmt.Errorf("key %s: stored scopes: %w", id, err)
		}
		k.Scopes = sc
	}
	k.CreatedAt = msTime(f["created"])
	if at, ok := f["revoked"]; ok {
		k.Revoked, k.RevokedAt = true, msTime(at)
	}
	return k, nil
}

func msTime(s string) time.Time {
	ms, err := strconv.ParseInt(s, 10, 64)
	if err != nil || ms <= 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms).UTC()
}

// List returns every key, or a tenant's, oldest first, with their
// last-used times. It reads every record: an admin's view, not a
// request's.
func (s *Store) List(ctx context.Context, tenant string) ([]Key, error) {
	ids, err := s.rdb.SMembers(ctx, s.idsKey()).Result()
	if err != nil {
		return nil, fmt.Errorf("list keys: %w", err)
	}
	if len(ids) == 0 {
		return []Key{}, nil
	}
	pipe := s.rdb.Pipeline()
	records := make([]*redis.MapStringStringCmd, len(ids))
	for i, id := range ids {
		records[i] = pipe.HGetAll(ctx, s.recordKey(id))
	}
	used := pipe.HMGet(ctx, s.usedKey(), ids...)
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("read %d keys: %w", len(ids), err)
	}
	out := make([]Key, 0, len(ids))
	for i, id := range ids {
		if len(records[i].Val()) == 0 {
			continue
		}
		k, err := decode(id, records[i].Val())
		if err != nil {
			return nil, err
		}
		if tenant != "" && k.Tenant != tenant {
			continue
		}
		if v, ok := used.Val()[i].(string); ok {
			k.LastUsedAt = msTime(v)
		}
		out = append(out, k)
	}
	slices.SortFunc(out, func(a, b Key) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out, nil
}

// Revoke marks a key revoked and announces it on Channel. It reports
// false if there is no such key; revoking twice is not an error.
func (s *Store) Revoke(ctx context.Context, id string) (bool, error) {
	n, err := revokeScript.Run(ctx, s.rdb, []string{s.recordKey(id)}, id, s.Channel()).Int()
	if err != nil {
		return false, fmt.Errorf("revoke key %s: %w", id, err)
	}
	return n != 0, nil
}

// Touch records that a key was used at at.
func (s *Store) Touch(ctx context.Context, id string, at time.Time) error {
	if err := s.rdb.HSet(ctx, s.usedKey(), id, at.UnixMilli()).Err(); err != nil {
		return fmt.Errorf("record use of key %s: %w", id, err)
	}
	return nil
}
