package chatclient

import (
	"context"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"
)

// refusalBackoff is how long a load's client waits after a refusal or a
// broken connection before its next request, as a client honouring
// Retry-After would, rather than hammering a door that just said no.
const refusalBackoff = 200 * time.Millisecond

// Target says where a load's client sends its next request: the base
// URL of an API and the API key to send with.
type Target func(client, n int) (baseURL, key string)

// Load is a closed loop of clients: each sends its next request as soon
// as its last one ended, until Stop.
type Load struct {
	mu      sync.Mutex
	results []*Result
	stop    chan struct{}
	done    sync.WaitGroup
}

// StartLoad starts clients that each send q, again and again, to where
// target says for the client's nth request.
func StartLoad(hc *http.Client, clients int, target Target, q Request) *Load {
	l := &Load{stop: make(chan struct{})}
	for c := range clients {
		l.done.Add(1)
		go func() {
			defer l.done.Done()
			l.run(hc, c, target, q)
		}()
	}
	return l
}

// run is one client's loop.
func (l *Load) run(hc *http.Client, client int, target Target, q Request) {
	for n := 0; ; n++ {
		select {
		case <-l.stop:
			return
		default:
		}
		baseURL, key := target(client, n)
		q.Key = key
		r := Send(context.Background(), hc, baseURL, q)
		l.mu.Lock()
		l.results = append(l.results, r)
		l.mu.Unlock()
		if r.Status != http.StatusOK || r.Err != nil {
			time.Sleep(refusalBackoff)
		}
	}
}

// Stop stops sending, waits for every client's last request, and
// returns every result.
func (l *Load) Stop() []*Result {
	close(l.stop)
	l.done.Wait()
	return l.results
}

// Crowd sends n clients, one every spread/n, each hanging up at a
// moment drawn from rng between 1 ms and leave after sending, and waits
// for them all. send makes client i's request, with LeaveAfter set to
// the moment it leaves.
func Crowd(n int, spread, leave time.Duration, rng *rand.Rand, send func(i int, leaveAfter time.Duration) *Result) []*Result {
	rs := make([]*Result, n)
	var wg sync.WaitGroup
	for i := range n {
		after := time.Duration(rng.Int64N(int64(leave))) + time.Millisecond
		wg.Add(1)
		go func() {
			defer wg.Done()
			rs[i] = send(i, after)
		}()
		time.Sleep(spread / time.Duration(n))
	}
	wg.Wait()
	return rs
}
