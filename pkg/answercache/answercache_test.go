package answercache

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/kbref"
	"github.com/sluice-dev/sluice/tests/testenv"
)

var srv *testenv.Redis

func TestMain(m *testing.M) {
	os.Exit(testenv.RedisMain(m, func(r *testenv.Redis) { srv = r }))
}

func answer(finish string, completion int) Answer {
	return Answer{Tokens: []string{"Tokens ", "refill."}, FinishReason: finish,
		Usage: events.Usage{PromptTokens: 50, CompletionTokens: completion, TotalTokens: 50 + completion}, RequestID: "chat-1"}
}

func TestHitMissAndWhatIsInTheKey(t *testing.T) {
	ctx := context.Background()
	c := New(srv.Client(t), testenv.KeyPrefix(t), time.Hour)
	k := Key{Query: "How do buckets refill?", KB: "docs", KBVersion: 3, Model: "m", Prompt: "p1"}
	if _, ok, err := c.Get(ctx, k, 100); err != nil || ok {
		t.Fatalf("empty cache: %v %v", ok, err)
	}
	if err := c.Put(ctx, k, answer("stop", 2)); err != nil {
		t.Fatal(err)
	}
	// The same question asked differently only in case and spacing hits.
	same := k
	same.Query = "  how do BUCKETS refill? "
	got, ok, err := c.Get(ctx, same, 100)
	if err != nil || !ok || len(got.Tokens) != 2 || got.RequestID != "chat-1" {
		t.Fatalf("get = %+v %v %v", got, ok, err)
	}
	// Anything the answer depends on misses.
	for name, other := range map[string]Key{
		"kb version": {Query: k.Query, KB: k.KB, KBVersion: 4, Model: k.Model, Prompt: k.Prompt},
		"kb":         {Query: k.Query, KB: "other", KBVersion: 3, Model: k.Model, Prompt: k.Prompt},
		"owner":      {Query: k.Query, KB: kbref.Own("acme", "docs").Key(), KBVersion: 3, Model: k.Model, Prompt: k.Prompt},
		"model":      {Query: k.Query, KB: k.KB, KBVersion: 3, Model: "m2", Prompt: k.Prompt},
		"prompt":     {Query: k.Query, KB: k.KB, KBVersion: 3, Model: k.Model, Prompt: "p2"},
		"query":      {Query: "How do queues drain?", KB: k.KB, KBVersion: 3, Model: k.Model, Prompt: k.Prompt},
	} {
		if _, ok, _ := c.Get(ctx, other, 100); ok {
			t.Errorf("another %s hits", name)
		}
	}
	// An answer longer than the asker's max_tokens is not theirs.
	if _, ok, _ := c.Get(ctx, k, 1); ok {
		t.Error("a 2-token answer served to a request allowing 1")
	}
	if st := c.Stats(); st.Hits != 1 || st.Misses != 8 || st.Bytes == 0 {
		t.Fatalf("stats = %+v", st)
	}
	ttl := srv.Client(t).PTTL(ctx, c.RedisKey(k)).Val()
	if ttl <= 59*time.Minute || ttl > time.Hour {
		t.Fatalf("ttl = %v", ttl)
	}
}

func TestOnlyCompleteAnswersAreKept(t *testing.T) {
	ctx := context.Background()
	c := New(srv.Client(t), testenv.KeyPrefix(t), time.Hour)
	k := Key{Query: "q", KB: "docs", KBVersion: 1, Model: "m", Prompt: "p"}
	for _, a := range []Answer{answer("length", 2), answer("", 2), {FinishReason: "stop"}} {
		if err := c.Put(ctx, k, a); err == nil {
			t.Errorf("kept %+v", a)
		}
	}
	if _, ok, _ := c.Get(ctx, k, 100); ok {
		t.Fatal("an incomplete answer was kept")
	}
}
