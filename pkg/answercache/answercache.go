// Package answercache is the L3 cache tier: whole answers to questions
// asked of a knowledge base, served again without admission or an LLM
// call. An answer is only right for the kb's content, the model and the
// prompt it was produced with, so all three are in its key: a kb change
// makes every earlier answer unreachable at once. Only complete answers
// are stored; whether a kb's answers may be shared at all is the
// operator's call (config answer_cache.kbs).
package answercache

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-dev/sluice/pkg/embed"
	"github.com/sluice-dev/sluice/pkg/events"
)

// Key names one answer.
type Key struct {
	// Query is normalised as the L1 and L2 tiers normalise it.
	Query string
	// KB is the kb's key (kbref.Ref.Key): an answer from a tenant's own
	// kb is only ever found by that tenant's requests, whatever other
	// tenants call their kbs; one from a shared kb by every tenant's.
	KB        string
	KBVersion int64
	// Model is the LLM model the answer came from; Prompt the version of
	// the prompt template it was asked with (prompt.Builder.Version).
	Model  string
	Prompt string
}

// Answer is a complete answer as its client saw it.
type Answer struct {
	// Tokens are the streamed pieces, replayed as they were sent.
	Tokens       []string     `json:"tokens"`
	FinishReason string       `json:"finish_reason"`
	Usage        events.Usage `json:"usage"`
	Sources      []string     `json:"sources,omitempty"`
	ContextShed  int          `json:"context_shed,omitempty"`
	// RequestID is the request that produced it.
	RequestID string    `json:"request_id"`
	CreatedAt time.Time `json:"created_at"`
}

// Redis is what the cache needs of a go-redis client.
type Redis interface {
	Get(ctx context.Context, key string) *redis.StringCmd
	Set(ctx context.Context, key string, value any, expiration time.Duration) *redis.StatusCmd
}

// Cache stores answers in Redis.
type Cache struct {
	rdb    Redis
	prefix string
	ttl    time.Duration

	hits, misses, bytes atomic.Int64
}

// Stats are the tier's counters since New: lookups that found an answer,
// lookups that did not, and bytes of answers served.
type Stats struct {
	Hits, Misses, Bytes int64
}

// New returns a Cache whose answers live ttl.
func New(rdb Redis, keyPrefix string, ttl time.Duration) *Cache {
	return &Cache{rdb: rdb, prefix: keyPrefix, ttl: ttl}
}

// RedisKey is where k's answer is kept.
func (c *Cache) RedisKey(k Key) string {
	// A JSON array keeps the fields apart whatever they contain.
	b, _ := json.Marshal([]any{embed.NormalizeQuery(k.Query, false), k.KB, k.KBVersion, k.Model, k.Prompt})
	sum := sha256.Sum256(b)
	return c.prefix + "l3:" + hex.EncodeToString(sum[:])
}

// Get returns k's answer if one is kept that fits within maxTokens (an
// answer longer than the asker allows would not have been given to them
// whole).
func (c *Cache) Get(ctx context.Context, k Key, maxTokens int) (Answer, bool, error) {
	raw, err := c.rdb.Get(ctx, c.RedisKey(k)).Bytes()
	if errors.Is(err, redis.Nil) {
		c.misses.Add(1)
		return Answer{}, false, nil
	}
	if err != nil {
		return Answer{}, false, fmt.Errorf("read cached answer: %w", err)
	}
	var a Answer
	if err := json.Unmarshal(raw, &a); err != nil {
		return Answer{}, false, fmt.Errorf("decode cached answer: %w", err)
	}
	if a.Usage.CompletionTokens > maxTokens {
		c.misses.Add(1)
		return Answer{}, false, nil
	}
	c.hits.Add(1)
	c.bytes.Add(int64(len(raw)))
	return a, true, nil
}

// Put keeps a complete answer; anything else is refused, so that a cut
// or failed answer is never served again.
func (c *Cache) Put(ctx context.Context, k Key, a Answer) error {
	if a.FinishReason != "stop" || len(a.Tokens) == 0 {
		return fmt.Errorf("cache answer of %s: only complete answers are kept (finish reason %q, %d tokens)", a.RequestID, a.FinishReason, len(a.Tokens))
	}
	b, err := json.Marshal(a)
	if err != nil {
		return fmt.Errorf("encode answer of %s: %w", a.RequestID, err)
	}
	if err := c.rdb.Set(ctx, c.RedisKey(k), b, c.ttl).Err(); err != nil {
		return fmt.Errorf("cache answer of %s: %w", a.RequestID, err)
	}
	return nil
}

// Stats returns the counters.
func (c *Cache) Stats() Stats {
	return Stats{Hits: c.hits.Load(), Misses: c.misses.Load(), Bytes: c.bytes.Load()}
}
