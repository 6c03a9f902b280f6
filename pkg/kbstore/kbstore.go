// Package kbstore keeps knowledge bases durably in Redis: each document's
// current revision (its chunks and their embeddings), the kb's version,
// which grows by one with every change, and a log of which documents
// changed at which version, so that every worker can bring its in-process
// index up to date by reading only what changed.
//
// A kb is named here by its key (kbref.Ref.Key): a tenant's own kb and a
// shared kb of the same name are two kbs with their own keys, versions,
// documents and retrieval-cache entries.
//
// Revisions are content-addressed (the hash of the document, the chunking
// and the embedder) and immutable: putting the same content again changes
// nothing, and a chunk id that names its revision always means the same
// text. A replaced or deleted revision is kept for a grace period for the
// requests still holding its chunk ids.
//
// Layout, per kb (all under one hash tag, the kb's key, so that a script
// over a kb's keys touches one Redis Cluster slot):
//
//	<prefix>kb:{<kb>}:version   counter
//	<prefix>kb:{<kb>}:epoch     when the version counter started
//	<prefix>kb:{<kb>}:docs      hash id -> current rev
//	<prefix>kb:{<kb>}:info      hash id -> DocInfo JSON
//	<prefix>kb:{<kb>}:log       zset id -> version of its last change
//	<prefix>kb:{<kb>}:model     the embedder model its vectors come from
//	<prefix>kb:{<kb>}:usage     hash bytes -> what its documents store,
//	                            memory -> what they take loaded in a worker,
//	                            chunks -> their chunks, indexed -> 1 once ids is
//	<prefix>kb:{<kb>}:ids       zset of the docs' ids, all scored 0 (pages by id)
//	<prefix>kb:{<kb>}:rev:<id>:<rev>  hash meta (JSON), vecs (float32 LE)
//	<prefix>kb:{<kb>}:l2doc:<id>      set of retrieval-cache keys holding it
//	<prefix>kbs                 set of the shared kbs' names
//	<prefix>kbs:t:<tenant>      set of the names of a tenant's own kbs
//
// The retrieval cache's entries carry the same tag (retrieval's
// CachedRetriever.Key), so put and delete can drop them in the same
// script. The name sets are one key each, in slots of their own: Put
// adds a kb's name before it writes the kb, never in the same script.
// (That layout is what kbs had before the cache's tag: an upgrade keeps
// every kb; only cache entries are written anew.)
package kbstore

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-dev/sluice/pkg/kbref"
)

var (
	//go:embed lua/put.lua
	putLua string
	//go:embed lua/delete.lua
	deleteLua string
	//go:embed lua/changes.lua
	changesLua string

	//go:embed lua/page.lua
	pageLua string

	//go:embed lua/tag.lua
	tagLua string
	//go:embed lua/index.lua
	indexLua string

	putScript     = redis.NewScript(tagLua + indexLua + putLua)
	deleteScript  = redis.NewScript(tagLua + indexLua + deleteLua)
	pageScript    = redis.NewScript(indexLua + pageLua)
	changesScript = redis.NewScript(changesLua)
)

// Redis is what the store needs of a go-redis client.
type Redis interface {
	redis.Scripter
	Get(ctx context.Context, key string) *redis.StringCmd
	MGet(ctx context.Context, keys ...string) *redis.SliceCmd
	HGetAll(ctx context.Context, key string) *redis.MapStringStringCmd
	HMGet(ctx context.Context, key string, fields ...string) *redis.SliceCmd
	SMembers(ctx context.Context, key string) *redis.StringSliceCmd
	SAdd(ctx context.Context, key string, members ...any) *redis.IntCmd
	Pipelined(ctx context.Context, fn func(redis.Pipeliner) error) ([]redis.Cmder, error)
}

// Store reads and writes knowledge bases.
type Store struct {
	rdb       Redis
	prefix    string
	grace     time.Duration
	maxMemory int64
}

// Options configures a Store.
type Options struct {
	// Prefix starts every key ("sluice:").
	Prefix string
	// Grace is how long a replaced or deleted revision stays readable
	// for requests that retrieved it before the change. Default 10m.
	Grace time.Duration
	// MaxKBMemory refuses a Put that would make a kb need more than this
	// in a worker's memory (the sum of its revisions' Memory): a worker
	// gives all the kbs it holds this much, so a larger kb could never be
	// loaded. 0 is no limit.
	MaxKBMemory int64
}

// New returns a Store.
func New(rdb Redis, opts Options) *Store {
	if opts.Grace <= 0 {
		opts.Grace = 10 * time.Minute
	}
	return &Store{rdb: rdb, prefix: opts.Prefix, grace: opts.Grace, maxMemory: opts.MaxKBMemory}
}

// Revision is one version of a document, chunked and embedded.
type Revision struct {
	ID    string `json:"id"`
	Rev   string `json:"rev"`
	Title string `json:"title"`
	// Metadata is stored once, in the document's DocInfo, which is what
	// reads of the kb return; retrieval never needs it, so the revision's
	// own record leaves it out. (A record written with it still reads.)
	Metadata map[string]string `json:"-"`
	// Chunks are the document's passages, in order.
	Chunks []string `json:"chunks"`
	// Vectors holds one embedding of Dims values per chunk, back to back.
	Vectors []float32 `json:"-"`
	Dims    int       `json:"dims"`
	// Memory is what the revision takes loaded in a worker's memory, as
	// retrieval.EstimateBytes puts it; Put records it in the DocInfo and
	// adds it to the kb's usage.
	Memory int64 `json:"-"`
}

// DocInfo describes a stored document without its text.
type DocInfo struct {
	ID       string            `json:"id"`
	Rev      string            `json:"rev"`
	Title    string            `json:"title"`
	Metadata map[string]string `json:"metadata,omitempty"`
	Chunks   int               `json:"chunks"`
	// Bytes is what it stores: its title, chunks and metadata, which
	// count toward its owner's ingestion quota.
	Bytes int64 `json:"bytes,omitempty"`
	// Memory is what it takes loaded in a worker's memory (Revision.Memory).
	Memory int64 `json:"memory_bytes,omitempty"`
	// Version is the kb version at which this revision was stored.
	Version int64 `json:"version"`
}

// RevisionHash names a revision by everything that decides its chunks and
// vectors: the document's content, how it is chunked (a caller's
// description, e.g. "words=90/20") and the embedder model.
func RevisionHash(id, title, text string, metadata map[string]string, chunking, model string) string {
	h := sha256.New()
	field := func(s string) { HashField(h, s) }
	field("sluice-doc/1")
	for _, s := range []string{id, title, text, chunking, model} {
		field(s)
	}
	keys := make([]string, 0, len(metadata))
	for k := range metadata {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		field(k)
		field(metadata[k])
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// HashField writes s to h length-prefixed, so that a sequence of fields
// hashes unambiguously ("ab","c" differs from "a","bc").
func HashField(h hash.Hash, s string) {
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(s)))
	h.Write(n[:])
	h.Write([]byte(s))
}

func (s *Store) kbPrefix(kb string) string { return s.prefix + "kb:{" + kb + "}:" }

// VersionKey is the key of kb's version.
func (s *Store) VersionKey(kb string) string { return s.kbPrefix(kb) + "version" }

func (s *Store) revKey(kb, id, rev string) string { return s.kbPrefix(kb) + "rev:" + id + ":" + rev }

// L2DocKey is the set of retrieval-cache keys whose result holds a chunk
// of document id; put and delete remove those entries.
func (s *Store) L2DocKey(kb, id string) string { return s.kbPrefix(kb) + "l2doc:" + id }

// ErrModelMismatch is Put into a kb whose vectors come from another
// embedder: mixing them would make similarities meaningless.
var ErrModelMismatch = errors.New("knowledge base embedded with another model")

// ErrTooLarge is a kb that would need more memory than a worker holds for
// knowledge bases (Options.MaxKBMemory).
var ErrTooLarge = errors.New("knowledge base too large for a worker's memory")

// TooLarge is the detail of a Put refused with ErrTooLarge.
type TooLarge struct {
	// Memory is what the kb would need after the Put; Max the limit.
	Memory, Max int64
}

func (e *TooLarge) Error() string {
	return fmt.Sprintf("%s: it would need %d bytes, the limit is %d", ErrTooLarge, e.Memory, e.Max)
}

func (e *TooLarge) Unwrap() error { return ErrTooLarge }

// PutResult is the outcome of Put.
type PutResult struct {
	// Version is the kb's version after the put (unchanged if nothing
	// changed).
	Version int64
	// Changed reports, per revision in order, whether it was new.
	Changed []bool
}

// namesKey is the set that lists a kb's name among its owner's kbs: the
// shared kbs' set, or the tenant's own.
func (s *Store) namesKey(owner kbref.Ref) string {
	if owner.IsShared() {
		return s.prefix + "kbs"
	}
	return s.prefix + "kbs:t:" + owner.Tenant
}

// Put stores revs as the current revisions of their documents in kb (a
// kbref key), in one atomic change, and returns the new version. The
// vectors must come from model. The kb is listed among its owner's (KBs)
// first, so a kb is never written without being listed (its owner's
// quota counts what the listed kbs store); a Put that then fails may
// leave an empty kb listed.
func (s *Store) Put(ctx context.Context, kb, model string, revs []Revision) (PutResult, error) {
	if len(revs) == 0 {
		return PutResult{}, errors.New("put into kb: no documents")
	}
	ref, err := kbref.ParseKey(kb)
	if err != nil {
		return PutResult{}, fmt.Errorf("put into kb: %w", err)
	}
	kp := s.kbPrefix(kb)
	keys := []string{kp + "version", kp + "docs", kp + "info", kp + "log", kp + "model", kp + "epoch", kp + "usage", kp + "ids"}
	args := []any{kp, ref.Name, model, s.grace.Milliseconds(), s.maxMemory, len(revs)}
	for _, r := range revs {
		if err := checkRevision(r); err != nil {
			return PutResult{}, fmt.Errorf("put %s into kb %s: %w", r.ID, kb, err)
		}
		meta, err := json.Marshal(r)
		if err != nil {
			return PutResult{}, fmt.Errorf("encode %s: %w", r.ID, err)
		}
		info, err := json.Marshal(DocInfo{ID: r.ID, Rev: r.Rev, Title: r.Title, Metadata: r.Metadata, Chunks: len(r.Chunks), Bytes: r.Bytes(), Memory: r.Memory})
		if err != nil {
			return PutResult{}, fmt.Errorf("encode %s: %w", r.ID, err)
		}
		keys = append(keys, s.revKey(kb, r.ID, r.Rev))
		args = append(args, r.ID, r.Rev, info, meta, encodeVectors(r.Vectors))
	}
	if err := s.rdb.SAdd(ctx, s.namesKey(ref), ref.Name).Err(); err != nil {
		return PutResult{}, fmt.Errorf("put into kb %s: list it: %w", kb, err)
	}
	raw, err := putScript.Run(ctx, s.rdb, keys, args...).Int64Slice()
	if err != nil {
		if strings.HasPrefix(err.Error(), "MODEL ") {
			return PutResult{}, fmt.Errorf("put into kb %s: %w: %s", kb, ErrModelMismatch, strings.TrimPrefix(err.Error(), "MODEL "))
		}
		var need, limit int64
		if _, serr := fmt.Sscanf(err.Error(), "TOOLARGE %d %d", &need, &limit); serr == nil {
			return PutResult{}, fmt.Errorf("put into kb %s: %w", kb, &TooLarge{Memory: need, Max: limit})
		}
		return PutResult{}, fmt.Errorf("put %d documents into kb %s: %w", len(revs), kb, err)
	}
	if len(raw) != 1+len(revs) {
		return PutResult{}, fmt.Errorf("put into kb %s: reply of %d values", kb, len(raw))
	}
	res := PutResult{Version: raw[0], Changed: make([]bool, len(revs))}
	for i := range revs {
		res.Changed[i] = raw[1+i] == 1
	}
	return res, nil
}

// Bytes is what a revision stores for its owner's quota: its title,
// chunks and metadata.
func (r Revision) Bytes() int64 {
	n := int64(len(r.Title)) + MetadataBytes(r.Metadata)
	for _, c := range r.Chunks {
		n += int64(len(c))
	}
	return n
}

// MetadataBytes is the size of a document's metadata: its keys and values.
func MetadataBytes(m map[string]string) int64 {
	var n int64
	for k, v := range m {
		n += int64(len(k) + len(v))
	}
	return n
}

// Usage is what a kb stores, for its owner's ingestion quota, and what it
// takes in a worker's memory (0 for a kb whose revisions carry no Memory).
type Usage struct {
	Documents, Bytes, Memory int64
}

// Usage reads what kb stores.
func (s *Store) Usage(ctx context.Context, kb string) (Usage, error) {
	kp := s.kbPrefix(kb)
	var docs *redis.IntCmd
	var usage *redis.SliceCmd
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		docs = p.HLen(ctx, kp+"docs")
		usage = p.HMGet(ctx, kp+"usage", "bytes", "memory")
		return nil
	})
	if err != nil {
		return Usage{}, fmt.Errorf("read the usage of kb %s: %w", kb, err)
	}
	u := Usage{Documents: docs.Val()}
	vals := usage.Val()
	for i, dst := range []*int64{&u.Bytes, &u.Memory} {
		if v, ok := vals[i].(string); ok {
			if *dst, err = strconv.ParseInt(v, 10, 64); err != nil {
				return Usage{}, fmt.Errorf("read the usage of kb %s: %w", kb, err)
			}
		}
	}
	return u, nil
}

func checkRevision(r Revision) error {
	switch {
	case r.ID == "" || strings.ContainsAny(r.ID, "\n\r") || strings.Contains(r.ID, "#"):
		return fmt.Errorf("document id %q: empty, or holds a line break or '#'", r.ID)
	case r.Rev == "":
		return errors.New("no revision")
	case len(r.Chunks) == 0:
		return errors.New("no chunks")
	case r.Dims <= 0 || len(r.Vectors) != r.Dims*len(r.Chunks):
		return fmt.Errorf("%d vector values for %d chunks of %d dimensions", len(r.Vectors), len(r.Chunks), r.Dims)
	}
	return nil
}

// Delete removes document id from kb. deleted is false if there was none
// (the version is then unchanged).
func (s *Store) Delete(ctx context.Context, kb, id string) (version int64, deleted bool, err error) {
	kp := s.kbPrefix(kb)
	raw, err := deleteScript.Run(ctx, s.rdb, []string{kp + "version", kp + "docs", kp + "info", kp + "log", kp + "usage", kp + "ids"},
		kp, id, s.grace.Milliseconds()).Int64Slice()
	if err != nil {
		return 0, false, fmt.Errorf("delete %s from kb %s: %w", id, kb, err)
	}
	if len(raw) != 2 {
		return 0, false, fmt.Errorf("delete %s from kb %s: reply of %d values", id, kb, len(raw))
	}
	return raw[0], raw[1] == 1, nil
}

// Version returns kb's version: 0 if it was never written.
func (s *Store) Version(ctx context.Context, kb string) (int64, error) {
	v, err := s.rdb.Get(ctx, s.VersionKey(kb)).Int64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read version of kb %s: %w", kb, err)
	}
	return v, nil
}

// Model returns the embedder model of kb's vectors ("" if never written).
func (s *Store) Model(ctx context.Context, kb string) (string, error) {
	m, err := s.rdb.Get(ctx, s.kbPrefix(kb)+"model").Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read model of kb %s: %w", kb, err)
	}
	return m, nil
}

// Change is a document changed after some version: its current revision,
// or "" when it was deleted.
type Change struct {
	ID  string
	Rev string
}

// Head is where a kb is: its version, and the epoch its version counter
// started in. A kb written again into a Redis that restarted empty counts
// its versions from 1 again, in a new epoch: a reader that loaded an
// older epoch must load the kb afresh, whatever the versions say.
type Head struct {
	Version int64
	Epoch   string
}

// Head reads kb's version and epoch (version 0: never written).
func (s *Store) Head(ctx context.Context, kb string) (Head, error) {
	kp := s.kbPrefix(kb)
	vals, err := s.rdb.MGet(ctx, kp+"version", kp+"epoch").Result()
	if err != nil {
		return Head{}, fmt.Errorf("read version of kb %s: %w", kb, err)
	}
	var h Head
	if v, ok := vals[0].(string); ok {
		if h.Version, err = strconv.ParseInt(v, 10, 64); err != nil {
			return Head{}, fmt.Errorf("read version of kb %s: %w", kb, err)
		}
	}
	h.Epoch, _ = vals[1].(string)
	return h, nil
}

// Changes returns kb's head and the documents changed after version
// since, read atomically. With since 0 that is every document.
func (s *Store) Changes(ctx context.Context, kb string, since int64) (Head, []Change, error) {
	kp := s.kbPrefix(kb)
	raw, err := changesScript.Run(ctx, s.rdb, []string{kp + "version", kp + "docs", kp + "log", kp + "epoch"}, since).Slice()
	if err != nil {
		return Head{}, nil, fmt.Errorf("read changes of kb %s since v%d: %w", kb, since, err)
	}
	if len(raw) < 2 || len(raw)%2 != 0 {
		return Head{}, nil, fmt.Errorf("read changes of kb %s: reply of %d values", kb, len(raw))
	}
	version, ok := raw[0].(int64)
	if !ok {
		return Head{}, nil, fmt.Errorf("read changes of kb %s: version %v", kb, raw[0])
	}
	epoch, _ := raw[1].(string)
	var out []Change
	for i := 2; i < len(raw); i += 2 {
		id, _ := raw[i].(string)
		rev, _ := raw[i+1].(string) // nil: deleted
		out = append(out, Change{ID: id, Rev: rev})
	}
	return Head{Version: version, Epoch: epoch}, out, nil
}

// Load reads revisions of kb's documents (as named by Changes), in order.
// A revision that is gone (replaced or deleted longer ago than the grace
// period) is an error wrapping ErrGone.
func (s *Store) Load(ctx context.Context, kb string, refs []Change) ([]Revision, error) {
	cmds := make([]*redis.MapStringStringCmd, len(refs))
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, r := range refs {
			cmds[i] = p.HGetAll(ctx, s.revKey(kb, r.ID, r.Rev))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("load %d documents of kb %s: %w", len(refs), kb, err)
	}
	out := make([]Revision, len(refs))
	for i, c := range cmds {
		m := c.Val()
		if len(m) == 0 {
			return nil, fmt.Errorf("load %s@%s of kb %s: %w", refs[i].ID, refs[i].Rev, kb, ErrGone)
		}
		var r Revision
		if err := json.Unmarshal([]byte(m["meta"]), &r); err != nil {
			return nil, fmt.Errorf("decode %s@%s of kb %s: %w", refs[i].ID, refs[i].Rev, kb, err)
		}
		r.Vectors, err = decodeVectors([]byte(m["vecs"]))
		if err != nil {
			return nil, fmt.Errorf("decode %s@%s of kb %s: %w", refs[i].ID, refs[i].Rev, kb, err)
		}
		if err := checkRevision(r); err != nil {
			return nil, fmt.Errorf("load %s@%s of kb %s: %w", refs[i].ID, refs[i].Rev, kb, err)
		}
		out[i] = r
	}
	return out, nil
}

// ErrGone is a revision that is no longer stored.
var ErrGone = errors.New("document revision no longer stored")

// Revs returns the current revision of each of ids in kb ("" if absent).
func (s *Store) Revs(ctx context.Context, kb string, ids []string) ([]string, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	raw, err := s.rdb.HMGet(ctx, s.kbPrefix(kb)+"docs", ids...).Result()
	if err != nil {
		return nil, fmt.Errorf("read revisions in kb %s: %w", kb, err)
	}
	out := make([]string, len(ids))
	for i, v := range raw {
		out[i], _ = v.(string)
	}
	return out, nil
}

// KBs lists the names of tenant's own kbs ever written, sorted; with
// tenant "", of the shared kbs ever written.
func (s *Store) KBs(ctx context.Context, tenant string) ([]string, error) {
	names, err := s.rdb.SMembers(ctx, s.namesKey(kbref.Ref{Tenant: tenant})).Result()
	if err != nil {
		return nil, fmt.Errorf("list kbs of %q: %w", tenant, err)
	}
	sort.Strings(names)
	return names, nil
}

func encodeVectors(v []float32) []byte {
	out := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(x))
	}
	return out
}

func decodeVectors(raw []byte) ([]float32, error) {
	if len(raw)%4 != 0 {
		return nil, fmt.Errorf("vectors of %d bytes", len(raw))
	}
	out := make([]float32, len(raw)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
	}
	return out, nil
}
