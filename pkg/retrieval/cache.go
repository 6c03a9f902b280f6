package retrieval

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-dev/sluice/pkg/embed"
)

//go:embed lua/l2get.lua
var l2getLua string

var l2getScript = redis.NewScript(l2getLua)

// Redis is the part of a go-redis client CachedRetriever needs;
// *redis.Client, *redis.ClusterClient and redis.UniversalClient satisfy it.
type Redis interface {
	redis.Scripter
	Get(ctx context.Context, key string) *redis.StringCmd
	Pipelined(ctx context.Context, fn func(redis.Pipeliner) error) ([]redis.Cmder, error)
}

// CacheOptions configures CachedRetriever.
type CacheOptions struct {
	// Prefix starts every Redis key, e.g. "sluice:".
	Prefix string
	// TTL is the Redis expiry of a result. Versioned keys already make
	// results of old content unreachable; the TTL reclaims their memory and
	// bounds how long a result outlives a change the version does not see.
	// Default 1h.
	TTL time.Duration
	// Version names everything besides the kb version that shapes a result
	// and that the key must therefore include: the embedder model that made
	// Query.Vector, the fusion settings, and the reranker version if reranked
	// results are cached (e.g. "local-hash-v1/256|lexical-v1/w0.5/k1=1.2/b=0.75").
	// It is the last component of the key.
	Version string
	// KeepCase keeps the query's case in the key. Leave it unset when
	// retrieval ignores case, as BM25 here and the local embedder do.
	KeepCase bool
	// DocIndexKey, if set, names the set that lists the cache keys whose
	// result holds a chunk of a document (kbstore.Store.L2DocKey): every
	// entry written is added to the set of each of its documents, so that
	// replacing or deleting a document deletes exactly those entries.
	DocIndexKey func(kb, docID string) string
	// VersionKey, if set, is the Redis key of a kb's version (the one the
	// wrapped retriever answers from, kbstore.Store.VersionKey): a hit then
	// costs one round trip, the version and the entry read by one script,
	// and the wrapped retriever is not consulted at all.
	VersionKey func(kb string) string
	// RefsOnly keeps only each chunk's ID, DocID and Score in Redis: a
	// hit returns chunks without Title and Text. It is for callers that
	// look chunks up by ID themselves (the chat activities do, at rerank):
	// an entry is then a seventh of the size or less, and decoding the
	// chunk text on every hit cost more than the search it saved on a
	// small kb. The key's version names the format, so entries of both
	// never mix.
	RefsOnly bool
	// Logger receives Redis failures, which the cache survives by
	// retrieving. Default slog.Default().
	Logger *slog.Logger
}

// CacheStats counts how CachedRetriever calls were answered.
type CacheStats struct {
	Hits   uint64
	Misses uint64
	// Bypassed counts queries to unversioned (version 0) kbs, which are
	// never cached.
	Bypassed uint64
	// RedisErrors counts failed Redis reads and writes, and undecodable
	// values.
	RedisErrors uint64
	// Bytes counts the bytes of cached results served.
	Bytes uint64
}

// CachedRetriever is the retrieval result cache. Its keys hold the kb
// version the wrapped retriever answers from, so a new version of a kb
// stops every old entry from being read at once, without deleting
// anything; old entries expire by TTL. It is safe for concurrent use.
type CachedRetriever struct {
	inner VersionedRetriever
	rdb   Redis
	opts  CacheOptions

	hits, misses, bypassed, redisErrors, bytes atomic.Uint64
}

// NewCachedRetriever wraps inner.
func NewCachedRetriever(inner VersionedRetriever, rdb Redis, opts CacheOptions) *CachedRetriever {
	if opts.TTL <= 0 {
		opts.TTL = time.Hour
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.RefsOnly {
		opts.Version += "|refs"
	}
	return &CachedRetriever{inner: inner, rdb: rdb, opts: opts}
}

// Retrieve is Get without the hit flag, so that a CachedRetriever is a
// Retriever.
func (c *CachedRetriever) Retrieve(ctx context.Context, q Query) (Result, error) {
	res, _, err := c.Get(ctx, q)
	return res, err
}

// KBVersion returns the version of kb the wrapped retriever would answer
// from now.
func (c *CachedRetriever) KBVersion(ctx context.Context, kb string) (int64, error) {
	p, err := c.inner.Pin(ctx, kb)
	if err != nil {
		return 0, err
	}
	return p.Version(), nil
}

// Get returns the result for q from Redis or from the wrapped retriever,
// and whether it came from Redis. The key covers the normalised q.Text
// only: q.Vector is assumed to be the embedding of q.Text by the model
// named in Options.Version. Redis failures are logged and counted, not returned.
//
// The kb is pinned first, so that a miss searches the very version its
// key names, however the kb changes meanwhile, and the version is read
// once.
func (c *CachedRetriever) Get(ctx context.Context, q Query) (Result, bool, error) {
	if c.opts.VersionKey != nil {
		if res, ok := c.hit(ctx, q); ok {
			return res, true, nil
		}
	}
	kb, err := c.inner.Pin(ctx, q.KB)
	if err != nil {
		return Result{}, false, err
	}
	version := kb.Version()
	if version == 0 {
		c.bypassed.Add(1)
		res, err := kb.Retrieve(ctx, q)
		return res, false, err
	}
	key := c.Key(q, version)
	writeBack := true
	raw, err := c.rdb.Get(ctx, key).Bytes()
	switch {
	case err == nil:
		res, derr := c.decode(raw)
		if derr == nil && res.KB == q.KB && res.KBVersion == version {
			c.hits.Add(1)
			c.bytes.Add(uint64(len(raw)))
			return res, true, nil
		}
		if derr == nil {
			derr = fmt.Errorf("value holds kb %q version %d", res.KB, res.KBVersion)
		}
		c.redisErrors.Add(1)
		c.opts.Logger.WarnContext(ctx, "retrieval cache: bad value, retrieving", "key", key, "err", derr)
	case errors.Is(err, redis.Nil):
	case ctx.Err() != nil:
		return Result{}, false, fmt.Errorf("read cached retrieval: %w", err)
	default:
		writeBack = false // Redis is failing: do not also wait for a write
		c.redisErrors.Add(1)
		c.opts.Logger.WarnContext(ctx, "retrieval cache: redis read failed, retrieving", "key", key, "err", err)
	}

	c.misses.Add(1)
	res, err := kb.Retrieve(ctx, q)
	if err != nil {
		return Result{}, false, err
	}
	// A Pinned that answered from another version than it named would be
	// a bug; its result must still not go under this key.
	if !writeBack || res.KBVersion != version {
		return res, false, nil
	}
	val, err := c.encode(res)
	if err != nil {
		return Result{}, false, fmt.Errorf("encode retrieval result for cache: %w", err)
	}
	_, err = c.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, key, val, c.opts.TTL)
		if c.opts.DocIndexKey == nil {
			return nil
		}
		seen := map[string]bool{}
		for _, ch := range res.Chunks {
			if seen[ch.DocID] {
				continue
			}
			seen[ch.DocID] = true
			set := c.opts.DocIndexKey(q.KB, ch.DocID)
			p.SAdd(ctx, set, key)
			p.Expire(ctx, set, c.opts.TTL)
		}
		return nil
	})
	if err != nil {
		c.redisErrors.Add(1)
		c.opts.Logger.WarnContext(ctx, "retrieval cache: redis write failed", "key", key, "err", err)
	}
	return res, false, nil
}

// hit answers q from Redis in one round trip if its entry at the kb's
// current version is there. Anything else — a miss, an unversioned kb, a
// Redis failure — is left to Get's full path.
func (c *CachedRetriever) hit(ctx context.Context, q Query) (Result, bool) {
	head, tail := c.keyParts(q)
	reply, err := l2getScript.Run(ctx, c.rdb, []string{c.opts.VersionKey(q.KB)}, head, tail).Slice()
	if err != nil || len(reply) != 2 {
		if err != nil && ctx.Err() == nil {
			c.redisErrors.Add(1)
			c.opts.Logger.WarnContext(ctx, "retrieval cache: one-trip read failed", "kb", q.KB, "err", err)
		}
		return Result{}, false
	}
	version, _ := strconv.ParseInt(fmt.Sprint(reply[0]), 10, 64)
	raw, ok := reply[1].(string)
	if !ok || version == 0 {
		return Result{}, false
	}
	res, err := c.decode([]byte(raw))
	if err != nil || res.KB != q.KB || res.KBVersion != version {
		return Result{}, false // the full path counts and logs it
	}
	c.hits.Add(1)
	c.bytes.Add(uint64(len(raw)))
	return res, true
}

// refsEntry is a RefsOnly entry: the chunks without their text.
type refsEntry struct {
	KB        string     `json:"kb"`
	KBVersion int64      `json:"kb_version"`
	Refs      []chunkRef `json:"refs"`
}

type chunkRef struct {
	ID    string  `json:"id"`
	DocID string  `json:"doc"`
	Score float64 `json:"s"`
}

func (c *CachedRetriever) encode(res Result) ([]byte, error) {
	if !c.opts.RefsOnly {
		return json.Marshal(res)
	}
	e := refsEntry{KB: res.KB, KBVersion: res.KBVersion, Refs: make([]chunkRef, len(res.Chunks))}
	for i, ch := range res.Chunks {
		e.Refs[i] = chunkRef{ID: ch.ID, DocID: ch.DocID, Score: ch.Score}
	}
	return json.Marshal(e)
}

func (c *CachedRetriever) decode(raw []byte) (Result, error) {
	var res Result
	if !c.opts.RefsOnly {
		err := json.Unmarshal(raw, &res)
		return res, err
	}
	var e refsEntry
	if err := json.Unmarshal(raw, &e); err != nil {
		return res, err
	}
	res = Result{KB: e.KB, KBVersion: e.KBVersion, Chunks: make([]Chunk, len(e.Refs))}
	for i, r := range e.Refs {
		res.Chunks[i] = Chunk{ID: r.ID, DocID: r.DocID, Score: r.Score}
	}
	return res, nil
}

// Key returns the Redis key of q at a kb version:
// prefix "ret:{" kb "}:v" kbVersion ":k" K ":" hex(SHA-256(normalised text)) ":" opts.Version.
// The kb is a Redis Cluster hash tag, the one every key of the kb has
// (its version key in kbstore, and the document sets that list its
// entries), so that a script reading or dropping an entry with
// them touches one slot. Entries from before the tag (prefix "ret:" kb
// ":v…") are never read again and expire by TTL: an upgrade starts the
// cache empty.
func (c *CachedRetriever) Key(q Query, version int64) string {
	head, tail := c.keyParts(q)
	return head + strconv.FormatInt(version, 10) + tail
}

// keyParts are q's key before and after its version.
func (c *CachedRetriever) keyParts(q Query) (string, string) {
	sum := sha256.Sum256([]byte(embed.NormalizeQuery(q.Text, c.opts.KeepCase)))
	return c.opts.Prefix + "ret:{" + q.KB + "}:v", ":k" + strconv.Itoa(q.K) + ":" + hex.EncodeToString(sum[:]) + ":" + c.opts.Version
}

// Stats returns the counters since NewCachedRetriever.
func (c *CachedRetriever) Stats() CacheStats {
	return CacheStats{
		Hits:        c.hits.Load(),
		Misses:      c.misses.Load(),
		Bypassed:    c.bypassed.Load(),
		RedisErrors: c.redisErrors.Load(),
		Bytes:       c.bytes.Load(),
	}
}
