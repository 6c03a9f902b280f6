package retrieval_test

// Tests against a real redis-server live in this external package: the
// testenv helper imports the workflows, which import this package, so an
// internal test importing testenv would be an import cycle.

import (
	"context"
	"io"
	"log/slog"
	"os"
	"sync"
	"testing"

	"github.com/sluice-dev/sluice/pkg/embed"
	"github.com/sluice-dev/sluice/pkg/retrieval"
	"github.com/sluice-dev/sluice/tests/testenv"
)

var testRedis *testenv.Redis

func TestMain(m *testing.M) {
	os.Exit(testenv.RedisMain(m, func(r *testenv.Redis) { testRedis = r }))
}

// prefix gives each test its own key space on the shared server.
func prefix(t testing.TB) string { return testenv.KeyPrefix(t) }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

var builtinKB = sync.OnceValues(func() (*retrieval.KB, error) {
	docs, err := retrieval.Builtin("sluice-docs")
	if err != nil {
		return nil, err
	}
	return retrieval.NewKB(context.Background(), "sluice-docs", docs, retrieval.KBOptions{
		Embedder: embed.NewLocal(embed.LocalOptions{}),
	})
})

func mustBuiltin(t testing.TB) *retrieval.KB {
	t.Helper()
	kb, err := builtinKB()
	if err != nil {
		t.Fatal(err)
	}
	return kb
}

func mustBuiltinEmbedder() embed.Embedder { return embed.NewLocal(embed.LocalOptions{}) }

func newHybrid(t testing.TB, opts retrieval.HybridOptions, kbs ...*retrieval.KB) *retrieval.Hybrid {
	t.Helper()
	h, err := retrieval.NewHybrid(opts, kbs...)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func queryVector(t testing.TB, text string) []float32 {
	t.Helper()
	vecs, err := embed.NewLocal(embed.LocalOptions{}).Embed(context.Background(), []string{text})
	if err != nil {
		t.Fatal(err)
	}
	return vecs[0]
}
