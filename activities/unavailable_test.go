package activities_test

import (
	"errors"
	"testing"

	"go.temporal.io/sdk/temporal"

	"github.com/redis/go-redis/v9"
	"github.com/sluice-dev/sluice/activities"
	"github.com/sluice-dev/sluice/tests/testenv"
)

// With the worker's interceptor, a stage whose Redis went away fails with
// a retryable DependencyUnavailable error the workflow turns into
// "unavailable"; without it, the same failure is an anonymous error.
func TestRedisGoneIsDependencyUnavailable(t *testing.T) {
	r := testenv.StartRedis(t)
	h := newHarness(t, func(o *harnessOptions) {
		// Without go-redis's own retries (~1.7 s a call against a closed
		// port) the stage fails inside the test's 3 s for a local
		// activity instead of timing out.
		o.redis = func(ro *redis.Options) { ro.Addr, ro.MaxRetries, ro.DialerRetries = r.Addr, -1, 1 }
	})
	in := activities.EmbedInput{RequestID: "gone", Query: query}
	if _, err := local[activities.EmbedOutput](t, h, h.acts.EmbedQuery, in); err != nil {
		t.Fatalf("embed with Redis up: %v", err)
	}
	ret := mustLocal[activities.RetrieveOutput](t, h, h.acts.Retrieve, activities.RetrieveInput{RequestID: "gone", KB: kbName, Query: query, K: 5})
	r.Stop()
	in.RequestID = "gone-2"
	var appErr *temporal.ApplicationError
	_, err := local[activities.EmbedOutput](t, h, h.acts.EmbedQuery, in, activities.UnavailableInterceptor())
	if !errors.As(err, &appErr) || appErr.Type() != activities.ErrTypeDependencyUnavailable || appErr.NonRetryable() {
		t.Fatalf("embed with Redis gone, intercepted: %v; want a retryable %s", err, activities.ErrTypeDependencyUnavailable)
	}
	_, err = local[activities.EmbedOutput](t, h, h.acts.EmbedQuery, in)
	if errors.As(err, &appErr) && appErr.Type() == activities.ErrTypeDependencyUnavailable {
		t.Fatalf("embed with Redis gone, not intercepted: %v; the type comes from the interceptor", err)
	}

	// Looking up the retrieved chunks in the kb (rerank's first step) is
	// Redis's failure too, never the client's bad request; what the
	// client is told then is unavailable's own message, not this error.
	_, err = local[activities.RerankOutput](t, h, h.acts.Rerank, activities.RerankInput{RequestID: "gone-3", KB: kbName, KBVersion: ret.KBVersion,
		Query: query, Hits: ret.Hits, K: 3}, activities.UnavailableInterceptor())
	if !errors.As(err, &appErr) || appErr.Type() != activities.ErrTypeDependencyUnavailable {
		t.Fatalf("rerank with Redis gone: %v; want %s", err, activities.ErrTypeDependencyUnavailable)
	}

	// A wrong request stays what it was.
	_, err = local[activities.RetrieveOutput](t, h, h.acts.Retrieve, activities.RetrieveInput{RequestID: "bad", KB: "no such kb", Query: query, K: 3},
		activities.UnavailableInterceptor())
	if errors.As(err, &appErr) && appErr.Type() == activities.ErrTypeDependencyUnavailable {
		t.Fatalf("retrieve from an unknown kb: %v; not a dependency's fault", err)
	}
}
