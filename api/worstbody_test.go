package api

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"runtime/metrics"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/embed"
	"github.com/sluice-dev/sluice/pkg/ingest"
	"github.com/sluice-dev/sluice/pkg/kbstore"
	"github.com/sluice-dev/sluice/pkg/semaphore"
)

// worstBody is the costliest body a route's limits let in, and what
// serving it may cost the process at most.
type worstBody struct {
	method, path, auth string
	// limit is the route's body limit; body is built to fill it.
	limit int
	body  func(limit int) []byte
	// items, instead of body, is the object of n items, which the test
	// fills to the limit with the most the route takes (more are refused
	// for what they ask, not for their size).
	items func(n int) string
	// admitted is the route's answer to a body it took and did its work
	// on (or, for one refused only after that work, the refusal): a body
	// refused early costs nothing, and proves no bound.
	admitted int
	// heap bounds the growth of the live heap while the request runs (its
	// peak, sampled, over the heap after a GC before it); allocs the bytes
	// allocated meanwhile. Both are about three times what was measured
	// (in the comment: live heap, allocated, on the 2-core dev machine
	// under -race), and both hold with the race detector on or off. CPU
	// time is logged, not bounded: on a shared machine it varies more
	// than these bounds allow.
	heap, allocs int64
}

// words is text of many distinct words, costly to tokenize and embed.
func words(n int) string {
	var b strings.Builder
	for i := 0; b.Len() < n; i++ {
		fmt.Fprintf(&b, "w%dx%d ", i%9973, i%7)
	}
	return b.String()[:n]
}

// fill pads a JSON object's text with spaces before its closing brace up
// to limit bytes: a body exactly at the limit.
func fill(obj string, limit int) []byte {
	if len(obj) > limit {
		panic(fmt.Sprintf("a body of %d bytes for a limit of %d", len(obj), limit))
	}
	return []byte(obj[:len(obj)-1] + strings.Repeat(" ", limit-len(obj)) + "}")
}

// repeatUpTo joins items made by item(i) with commas, as many as fit in room bytes.
func repeatUpTo(room int, item func(i int) string) string {
	var b strings.Builder
	for i := 0; ; i++ {
		next := item(i)
		if b.Len()+len(next)+1 > room {
			return b.String()
		}
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(next)
	}
}

// worstBodies are the body-taking routes, each with its stated bound
// (docs/security.md#ingest-and-knowledge-base-bounds). The bounds hold
// under the race detector, which makes the CPU several times larger.
func worstBodies(cfg config.Config) map[string]worstBody {
	api, ingestLimit := int(cfg.API.MaxBodyBytes), int(cfg.Ingest.MaxBodyBytes)
	return map[string]worstBody{
		"POST /v1/chat: the longest query": {method: "POST", path: "/v1/chat", auth: "Bearer k-acme", limit: api,
			body: func(limit int) []byte {
				return fill(`{"query":"`+words(cfg.API.MaxQueryChars)+`","max_tokens":16}`, limit)
			}, admitted: http.StatusOK, heap: 4 << 20, allocs: 4 << 20}, // measured 1.2–1.4 MiB, 1.2–1.4 MiB
		// The most messages the largest prompt takes (found by bisection,
		// the rest of the body space): more are refused before the work,
		// context_length_exceeded.
		"POST /v1/chat/completions: the most messages": {method: "POST", path: "/v1/chat/completions", auth: "Bearer k-acme", limit: api,
			items: func(n int) string {
				msgs := make([]string, n)
				for i := range msgs {
					msgs[i] = `{"role":"user","content":"` + words(8) + `"}`
				}
				return `{"model":"sluice-sim","max_tokens":16,"messages":[` + strings.Join(msgs, ",") + `]}`
			}, admitted: http.StatusOK, heap: 10 << 20, allocs: 10 << 20}, // 744 messages; measured 3.3 MiB, 3.4 MiB
		// Refused, but only once every message is counted: that work is
		// what a client can make the route do for nothing.
		"POST /v1/chat/completions: the most messages, too long for any model": {method: "POST", path: "/v1/chat/completions", auth: "Bearer k-acme", limit: api,
			body: func(limit int) []byte {
				msgs := repeatUpTo(limit-64, func(i int) string { return `{"role":"user","content":"` + words(8) + `"}` })
				return fill(`{"model":"sluice-sim","max_tokens":16,"messages":[`+msgs+`]}`, limit)
			}, admitted: http.StatusBadRequest, heap: 24 << 20, allocs: 24 << 20}, // measured 8.0 MiB, 8.0 MiB
		"POST /v1/embeddings: the most inputs": {method: "POST", path: "/v1/embeddings", auth: "Bearer k-acme", limit: api,
			body: func(limit int) []byte {
				each := (limit - 64) / 128
				in := repeatUpTo(limit-64, func(i int) string { return `"` + words(each-4) + `"` })
				return fill(`{"model":"`+cfg.Embedding.Model+`","input":[`+in+`]}`, limit)
			}, admitted: http.StatusOK, heap: 64 << 20, allocs: 64 << 20}, // measured 22.8 MiB, 22.8 MiB
		"POST /v1/kb/:kb/documents: the most documents, text and metadata": {method: "POST", path: "/v1/kb/worst/documents", auth: "Bearer k-acme", limit: ingestLimit,
			body: func(limit int) []byte {
				n := cfg.Ingest.MaxDocuments
				meta := `{"source":"` + strings.Repeat("m", cfg.Ingest.MaxMetadataBytes-len("source")) + `"}`
				text := words((limit-64)/n - len(meta) - 64)
				docs := repeatUpTo(limit-64, func(i int) string {
					return fmt.Sprintf(`{"id":"d%d","text":"%s","metadata":%s}`, i, text, meta)
				})
				return fill(`{"documents":[`+docs+`]}`, limit)
			}, admitted: http.StatusOK, heap: 448 << 20, allocs: 1792 << 20}, // measured 152 MiB, 590 MiB
		"PUT /v1/admin/limits: the largest policy": {method: "PUT", path: "/v1/admin/limits", auth: "Bearer root", limit: policyBodyLimit,
			admitted: http.StatusOK, heap: 16 << 20, allocs: 16 << 20}, // body: the live policy, filled; measured 5.2 MiB, 5.2 MiB

		// Scopes may not repeat, names are at most 64 characters: the
		// rest of the largest key request it takes is space.
		"POST /v1/admin/keys: the largest key request": {method: "POST", path: "/v1/admin/keys", auth: "Bearer root", limit: api,
			body: func(limit int) []byte {
				name := strings.Repeat("n", 64)
				return fill(`{"tenant":"`+name+`","user":"`+name+`","tier":"vip","scopes":["chat","ingest","admin"]}`, limit)
			}, admitted: http.StatusCreated, heap: 1 << 20, allocs: 1 << 20}, // measured 0.3 MiB, 0.3 MiB
		"POST /codec/decode: the most payloads": {method: "POST", path: "/codec/decode", auth: "Bearer root", limit: codecBodyLimit,
			body: func(limit int) []byte {
				data := base64.StdEncoding.EncodeToString([]byte(`"x"`))
				enc := base64.StdEncoding.EncodeToString([]byte("json/plain"))
				ps := repeatUpTo(limit-32, func(i int) string {
					return `{"metadata":{"encoding":"` + enc + `"},"data":"` + data + `"}`
				})
				return fill(`{"payloads":[`+ps+`]}`, limit)
			}, admitted: http.StatusOK, heap: 448 << 20, allocs: 640 << 20}, // measured 145 MiB, 208 MiB
	}
}

// measure runs f and reports the peak growth of the live heap while it
// ran, the bytes it allocated and the process's CPU time.
func measure(f func()) (heap, allocs int64, cpu time.Duration) {
	runtime.GC()
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	read := func() int64 {
		metrics.Read(sample)
		return int64(sample[0].Value.Uint64())
	}
	allocated := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(allocated)
	allocBase := int64(allocated[0].Value.Uint64())
	base, peak := read(), int64(0)
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for {
			if n := read() - base; n > peak {
				peak = n
			}
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
	before := cpuTime()
	f()
	cpu = cpuTime() - before
	metrics.Read(allocated)
	allocs = int64(allocated[0].Value.Uint64()) - allocBase
	close(stop)
	<-done
	if n := read() - base; n > peak {
		peak = n
	}
	return peak, allocs, cpu
}

// mostTaken is w's body of the most items its route takes, found by
// bisection.
func mostTaken(t *testing.T, w worstBody, send func(worstBody, []byte) *httptest.ResponseRecorder) []byte {
	t.Helper()
	taken := func(n int) bool {
		return len(w.items(n)) <= w.limit && send(w, fill(w.items(n), w.limit)).Code == w.admitted
	}
	lo, hi := 1, 2
	for taken(hi) {
		lo, hi = hi, hi*2
	}
	if !taken(lo) {
		t.Fatalf("%s %s takes not even one item", w.method, w.path)
	}
	for hi-lo > 1 { // lo is taken, hi is not
		if mid := (lo + hi) / 2; taken(mid) {
			lo = mid
		} else {
			hi = mid
		}
	}
	t.Logf("the most items taken: %d", lo)
	return fill(w.items(lo), w.limit)
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// worstBodyServer serves every body-taking route with the default limits.
func worstBodyServer(t *testing.T) (*Server, config.Config) {
	var cfg config.Config
	srv, _, rdb := newTestServerWith(t, func(c *config.Config) {
		def := config.Default()
		c.API.MaxBodyBytes, c.API.MaxQueryChars = def.API.MaxBodyBytes, def.API.MaxQueryChars
		withCodec()(c)
		cfg = *c
	}, func(rdb *redis.Client, o *Options) {
		prefix := "t:" + t.Name() + ":"
		store := kbstore.New(rdb, kbstore.Options{Prefix: prefix})
		o.KBs, o.Ingester = store, &ingest.Ingester{Store: store, Embedder: embed.NewLocal(embed.LocalOptions{}),
			MaxMetadataBytes: o.Config.Ingest.MaxMetadataBytes}
		slots, err := semaphore.New(rdb, semaphore.Options{Key: prefix + "ingest", Limit: o.Config.Ingest.MaxConcurrent,
			GroupLimit: o.Config.Ingest.TenantPermits(), Lease: o.Config.Ingest.Lease})
		if err != nil {
			t.Fatal(err)
		}
		o.IngestSlots = slots
		o.Embeddings = embed.NewCache(embed.NewLocal(embed.LocalOptions{}), rdb, embed.CacheOptions{Prefix: prefix, TTL: time.Minute, LRUSize: 16})
		// A chat request is admitted all the way to its start.
		o.Temporal = &startingClient{countingClient: o.Temporal.(*countingClient)}
	})
	withManagedKeys(t, srv, rdb, sharedPrefix(t, rdb))
	// The bounds are the handler's own, without the test's check of its
	// answers against the API description (which holds them in memory).
	unchecked(srv)
	return srv, cfg
}

// Each route that takes a body, sent the costliest body its limits let
// in, takes it (its admitted answer: the work was done, not refused
// early) within its stated memory bounds; a byte more is refused with 413
// before any of that work.
func TestWorstBodiesStayInBounds(t *testing.T) {
	srv, cfg := worstBodyServer(t)
	send := func(w worstBody, body []byte) *httptest.ResponseRecorder {
		// A chat's client leaves once its request has started (startingClient).
		ctx, leave := context.WithCancel(context.Background())
		defer leave()
		req := httptest.NewRequest(w.method, w.path, bytes.NewReader(body)).WithContext(context.WithValue(ctx, leaveKey{}, leave))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", w.auth)
		rec := httptest.NewRecorder()
		srv.Handler().ServeHTTP(rec, req)
		return rec
	}
	for name, w := range worstBodies(cfg) {
		t.Run(name, func(t *testing.T) {
			var body []byte
			switch {
			case w.body != nil:
				body = w.body(w.limit)
			case w.items != nil:
				body = mostTaken(t, w, send)
			default:
				live := send(worstBody{method: "GET", path: w.path, auth: w.auth}, nil)
				body = fill(strings.TrimSpace(live.Body.String()), w.limit)
			}
			if len(body) != w.limit {
				t.Fatalf("a worst body of %d bytes for a limit of %d", len(body), w.limit)
			}
			send(w, []byte("{}")) // what is loaded once (tokenizers, scripts) is not the body's cost
			var rec *httptest.ResponseRecorder
			heap, allocs, cpu := measure(func() { rec = send(w, body) })
			t.Logf("%d-byte body: %d %.60s; heap +%.1f MiB (bound %d MiB), allocated %.1f MiB (bound %d MiB), CPU %v",
				len(body), rec.Code, rec.Body, float64(heap)/(1<<20), w.heap>>20, float64(allocs)/(1<<20), w.allocs>>20, cpu.Round(time.Millisecond))
			if rec.Code != w.admitted {
				t.Fatalf("answered %d, want %d (taken): %.300s", rec.Code, w.admitted, rec.Body)
			}
			if heap > w.heap || allocs > w.allocs {
				t.Fatalf("heap +%d bytes (bound %d), allocated %d bytes (bound %d)", heap, w.heap, allocs, w.allocs)
			}
			over := append(body, ' ')
			if rec := send(w, over); rec.Code != http.StatusRequestEntityTooLarge {
				t.Fatalf("a byte over the limit: %d %s", rec.Code, rec.Body)
			}
		})
	}
}
