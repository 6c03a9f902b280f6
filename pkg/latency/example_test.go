package latency_test

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-dev/sluice/pkg/latency"
)

// Every process records into its own Window and runs it; the healer, in
// any of them, reads the window over all of them.
func ExampleWindow() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: latency.RedisAddr()}) // "localhost:6379"
	defer rdb.Close()
	w, err := latency.New(rdb, latency.Options{
		// A prefix of its own, so that the example counts only itself.
		KeyPrefix: "example:" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":",
	})
	if err != nil {
		panic(err)
	}
	// A process runs it for its lifetime (`g.Go(func() error { return
	// w.Run(ctx) })`); here one flush does.

	firstToken := latency.Series("llm_first_token", "short")
	requests := latency.Series("llm_requests", "short")
	timeouts := latency.Series("llm_timeout", "short")
	for i := range 1000 {
		// One request in five is slow: a tail.
		if i%5 == 4 {
			w.Record(firstToken, 2*time.Second)
		} else {
			w.Record(firstToken, 50*time.Millisecond)
		}
		w.Add(requests, 1)
	}
	w.Add(timeouts, 30)
	if err := w.Flush(ctx); err != nil {
		panic(err)
	}

	s, err := w.Snapshots(ctx, time.Minute, firstToken, requests, timeouts)
	if err != nil {
		panic(err)
	}
	ft := s[0]
	fmt.Printf("%d first tokens: P50 %v, P99 %v, P99/P50 %.0f\n",
		ft.Count, ft.P50.Round(time.Millisecond), ft.P99.Round(10*time.Millisecond), ft.TailRatio())
	fmt.Printf("timeout rate %.1f%%\n", 100*float64(s[2].Added)/float64(s[1].Added))
	// Output:
	// 1000 first tokens: P50 52ms, P99 1.91s, P99/P50 37
	// timeout rate 3.0%
}
