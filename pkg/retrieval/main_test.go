package retrieval

import (
	"context"
	"sync"
	"testing"

	"github.com/sluice-dev/sluice/pkg/embed"
)

// builtinKB loads the built-in corpus once per test binary; building it is
// deterministic and the KB is immutable.
var builtinKB = sync.OnceValues(func() (*KB, error) {
	docs, err := Builtin("sluice-docs")
	if err != nil {
		return nil, err
	}
	return NewKB(context.Background(), "sluice-docs", docs, KBOptions{
		Embedder: embed.NewLocal(embed.LocalOptions{}),
	})
})

func mustBuiltin(t testing.TB) *KB {
	t.Helper()
	kb, err := builtinKB()
	if err != nil {
		t.Fatal(err)
	}
	return kb
}

func queryVector(t testing.TB, text string) []float32 {
	t.Helper()
	vecs, err := embed.NewLocal(embed.LocalOptions{}).Embed(context.Background(), []string{text})
	if err != nil {
		t.Fatal(err)
	}
	return vecs[0]
}
