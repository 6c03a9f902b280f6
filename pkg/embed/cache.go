package embed

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Tiers a Cache.Get can answer from.
const (
	TierMemory = "memory" // the in-process LRU
	TierRedis  = "redis"  // Redis, shared by all workers
	TierMiss   = "miss"   // computed by the embedder, then stored in both
)

// Redis is the part of a go-redis client the cache needs; *redis.Client,
// *redis.ClusterClient and redis.UniversalClient satisfy it.
type Redis interface {
	Get(ctx context.Context, key string) *redis.StringCmd
	Set(ctx context.Context, key string, value any, expiration time.Duration) *redis.StatusCmd
}

// CacheOptions configures Cache.
type CacheOptions struct {
	// Prefix starts every Redis key, e.g. "sluice:".
	Prefix string
	// TTL is the Redis expiry of a vector, counted from when it was
	// computed. Vectors never go stale (they depend only on the text and the
	// model, which is in the key); the TTL only lets cold queries leave.
	// Default 24h.
	TTL time.Duration
	// LRUSize is the number of vectors held in process. Default 10000
	// (about 10 MiB at 256 dimensions).
	LRUSize int
	// KeepCase keeps the query's case in the cache key and in the text that
	// is embedded. Without it, queries are lower-cased, which is lossless
	// for Local: it lower-cases and splits on every non-letter, non-digit
	// itself, so a query and its normalised form embed to the identical
	// vector. Set it for remote embedders whose models are case sensitive.
	KeepCase bool
	// Logger receives Redis failures, which the cache survives by
	// computing the vector. Default slog.Default().
	Logger *slog.Logger
}

// CacheStats counts how Get calls were answered.
type CacheStats struct {
	MemoryHits uint64
	RedisHits  uint64
	// Misses counts vectors computed by the embedder.
	Misses uint64
	// Shared counts calls that waited for a concurrent call for the same
	// query instead of doing the work themselves.
	Shared uint64
	// RedisErrors counts failed Redis reads and writes, and undecodable
	// values.
	RedisErrors uint64
	// Bytes counts the bytes of vectors served from either tier.
	Bytes uint64
}

// Cache is the query→embedding tier: an in-process LRU in front of Redis in
// front of an Embedder. A vector depends only on the normalised query and
// the embedder's Model, both in the key, so entries are never invalid; this
// tier needs no versioning. It is safe for concurrent use.
//
// Unlike the retrieval and answer tiers it is shared by every tenant, on
// purpose: an entry holds nothing of any tenant's knowledge bases or
// sessions — only the vector of a text, which is a function of that text
// and the model — and it is found only by a request that already holds
// the same text (the key is its hash). What a hit tells a caller is that
// the same normalised question was embedded before, by someone; keying by
// tenant would hide that at the cost of every tenant embedding the common
// questions again.
type Cache struct {
	emb    Embedder
	model  string
	rdb    Redis
	opts   CacheOptions
	mem    *lru
	flight flight

	memoryHits, redisHits, misses, shared, redisErrors, bytes atomic.Uint64
}

// NewCache wraps emb. rdb may be nil, which leaves the cache in process only.
func NewCache(emb Embedder, rdb Redis, opts CacheOptions) *Cache {
	if opts.TTL <= 0 {
		opts.TTL = 24 * time.Hour
	}
	if opts.LRUSize <= 0 {
		opts.LRUSize = 10000
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Cache{emb: emb, model: emb.Model(), rdb: rdb, opts: opts, mem: newLRU(opts.LRUSize)}
}

// Model returns the wrapped embedder's Model.
func (c *Cache) Model() string { return c.model }

// Get returns the vector of query and the tier that answered. On a miss
// the normalised query (see NormalizeQuery) is embedded, so that the vector
// is exactly what the key promises. The vector is shared with the cache
// and other callers: it must not be modified. A call that waited for a
// concurrent call for the same query reports that call's tier.
//
// Redis failures are logged and counted, not returned: the vector is then
// computed, because a slow or down cache must not fail requests.
func (c *Cache) Get(ctx context.Context, query string) ([]float32, string, error) {
	norm := NormalizeQuery(query, c.opts.KeepCase)
	digest := c.digest(norm)
	if vec, ok := c.mem.get(digest); ok {
		c.memoryHits.Add(1)
		c.bytes.Add(uint64(4 * len(vec)))
		return vec, TierMemory, nil
	}
	for {
		vec, tier, shared, err := c.flight.do(ctx, digest, func() ([]float32, string, error) {
			return c.load(ctx, digest, norm)
		})
		if shared {
			// The caller that ran the load may have been cancelled while this
			// one still has time: try again rather than fail with its error.
			if err != nil && ctx.Err() == nil && isContextErr(err) {
				continue
			}
			if err == nil {
				c.shared.Add(1)
			}
		}
		if err != nil {
			return nil, "", err
		}
		return vec, tier, nil
	}
}

// Key returns the Redis key of query.
func (c *Cache) Key(query string) string {
	return c.redisKey(c.digest(NormalizeQuery(query, c.opts.KeepCase)))
}

// Stats returns the counters since NewCache.
func (c *Cache) Stats() CacheStats {
	return CacheStats{
		MemoryHits:  c.memoryHits.Load(),
		RedisHits:   c.redisHits.Load(),
		Misses:      c.misses.Load(),
		Shared:      c.shared.Load(),
		RedisErrors: c.redisErrors.Load(),
		Bytes:       c.bytes.Load(),
	}
}

// Len returns the number of vectors held in process.
func (c *Cache) Len() int { return c.mem.len() }

// digest is SHA-256(normalised query + "\x00" + model). The NUL keeps
// "ab"+"c" and "a"+"bc" apart.
func (c *Cache) digest(norm string) [32]byte {
	var stack [256]byte
	buf := append(stack[:0], norm...)
	buf = append(buf, 0)
	buf = append(buf, c.model...)
	return sha256.Sum256(buf)
}

func (c *Cache) redisKey(digest [32]byte) string {
	return c.opts.Prefix + "emb:" + hex.EncodeToString(digest[:])
}

// load answers from Redis or computes, and fills both tiers.
func (c *Cache) load(ctx context.Context, digest [32]byte, norm string) ([]float32, string, error) {
	// A concurrent load may have filled the LRU since Get looked.
	if vec, ok := c.mem.get(digest); ok {
		c.memoryHits.Add(1)
		c.bytes.Add(uint64(4 * len(vec)))
		return vec, TierMemory, nil
	}
	key := ""
	redisOK := c.rdb != nil
	if redisOK {
		key = c.redisKey(digest)
		raw, err := c.rdb.Get(ctx, key).Bytes()
		switch {
		case err == nil:
			vec, derr := decodeVector(raw)
			if derr == nil {
				c.redisHits.Add(1)
				c.bytes.Add(uint64(len(raw)))
				c.mem.put(digest, vec)
				return vec, TierRedis, nil
			}
			c.redisErrors.Add(1)
			c.opts.Logger.WarnContext(ctx, "embedding cache: undecodable value, recomputing", "key", key, "err", derr)
		case errors.Is(err, redis.Nil):
		case isContextErr(err) && ctx.Err() != nil:
			return nil, "", fmt.Errorf("read cached embedding: %w", err)
		default:
			// Redis is failing: do not also wait for a write.
			redisOK = false
			c.redisErrors.Add(1)
			c.opts.Logger.WarnContext(ctx, "embedding cache: redis read failed, computing", "key", key, "err", err)
		}
	}
	vecs, err := c.emb.Embed(ctx, []string{norm})
	if err != nil {
		return nil, "", fmt.Errorf("embed query with %s: %w", c.model, err)
	}
	if len(vecs) != 1 || len(vecs[0]) == 0 {
		return nil, "", fmt.Errorf("embed query with %s: got %d vectors, want 1", c.model, len(vecs))
	}
	vec := vecs[0]
	c.misses.Add(1)
	c.mem.put(digest, vec)
	if redisOK {
		if err := c.rdb.Set(ctx, key, encodeVector(vec), c.opts.TTL).Err(); err != nil {
			c.redisErrors.Add(1)
			c.opts.Logger.WarnContext(ctx, "embedding cache: redis write failed", "key", key, "err", err)
		}
	}
	return vec, TierMiss, nil
}

func isContextErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// encodeVector stores a vector as little-endian float32s: 1 KiB for 256
// dimensions, a third of its JSON and with no parsing on the way back.
func encodeVector(vec []float32) []byte {
	out := make([]byte, 4*len(vec))
	for i, x := range vec {
		binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(x))
	}
	return out
}

func decodeVector(raw []byte) ([]float32, error) {
	if len(raw) == 0 || len(raw)%4 != 0 {
		return nil, fmt.Errorf("decode cached embedding: %d bytes is not a float32 vector", len(raw))
	}
	vec := make([]float32, len(raw)/4)
	for i := range vec {
		vec[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
	}
	return vec, nil
}
