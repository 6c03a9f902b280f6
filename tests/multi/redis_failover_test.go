package multi

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	enumspb "go.temporal.io/api/enums/v1"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/tests/chatclient"
	"github.com/sluice-dev/sluice/workflows"
)

// TestRedisFailoverUnderLoad fails over the Redis master that holds the
// short pool's queue and permits twice while clients stream through both
// APIs: first by hand (CLUSTER FAILOVER on its replica: the replica
// catches up, then takes over, so nothing acknowledged is lost), then by
// a crash (kill -9: the cluster promotes the replica after its node
// timeout; writes not yet replicated are lost). Every client must get an
// answer or a terminal event, the janitors must notice each change of the
// queue's Redis and ask the waiters to re-check, and once the load ends
// nothing may be left in use. What the crash cost is logged: the run
// shows it in the test output. It runs last: the killed node is not
// started again.
func TestRedisFailoverUnderLoad(t *testing.T) {
	s := stackFor(t)
	ctx := context.Background()
	gate, err := admission.New(redis.NewClient(&redis.Options{}), app.GateOptions(s.cfg))
	if err != nil {
		t.Fatal(err)
	}
	slotKey := gate.PermitsKey(request.PoolShort)
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	w := s.watchShortPool(wctx)
	load := s.closedLoop(8, chatclient.Request{MaxTokens: 60, Bound: 2 * time.Minute})
	time.Sleep(5 * time.Second)

	first, err := s.masterOf(ctx, slotKey)
	if err != nil {
		t.Fatal(err)
	}
	replica, err := s.replicaOf(ctx, first)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the short pool's queue is on master %s, replica %s", first, replica)

	// 1. By hand: the replica asks for the master's last writes first.
	start := time.Now()
	rc := nodeClient(replica)
	defer rc.Close()
	if err := rc.ClusterFailover(ctx).Err(); err != nil {
		t.Fatalf("CLUSTER FAILOVER on %s: %v", replica, err)
	}
	if err := waitRole(ctx, replica, "master", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	t.Logf("manual failover: %s is master after %s", replica, time.Since(start).Round(time.Millisecond))
	time.Sleep(8 * time.Second)

	// 2. A crash of the new master: its replica (the first master) is
	// promoted once the cluster stops hearing from it.
	start = time.Now()
	if err := s.cluster.Kill(replica); err != nil {
		t.Fatal(err)
	}
	if err := waitRole(ctx, first, "master", 45*time.Second); err != nil {
		t.Fatal(err)
	}
	t.Logf("crash: %s killed, %s promoted after %s", replica, first, time.Since(start).Round(time.Millisecond))
	time.Sleep(8 * time.Second)

	rs := load.Stop()
	stopWatch()
	<-w.done
	t.Logf("%d requests through both failovers: %s; at most %d short permits in use, %d requests on the simulators at once (limit %d); %d reads of the pool failed",
		len(rs), chatclient.Tally(rs), w.maxInUse, w.maxRunning, shortLimit, w.errs)
	for _, r := range rs {
		if !r.OK() {
			t.Errorf("promise broken: %s\n%s", r.Summary(), s.describe(ctx, r.ID))
		}
		// A request the failover stopped is told to retry (unavailable,
		// with when), not that Sluice failed.
		if r.Reason == request.ReasonInternal {
			t.Errorf("ended as Sluice's fault: %s\n%s", r.Summary(), s.describe(ctx, r.ID))
		}
	}
	// Each worker's janitor notes the queue's Redis; one of them is told
	// of each change.
	changes := 0
	for _, p := range s.workers {
		raw, _ := os.ReadFile(p.LogPath)
		changes += strings.Count(string(raw), "the Redis serving the admission queue changed")
	}
	t.Logf("the janitors saw the queue's Redis change %d times", changes)
	if changes < 2 {
		t.Errorf("the janitors noticed %d changes of the short pool's Redis, want 2 (a manual failover and a crash)", changes)
	}
	// And after the load nothing is left in use and every reservation is
	// settled: what a lost write took has healed. A stream cut by the
	// crash before the worker could read what an earlier attempt had
	// sent keeps its whole charge (docs/redis-cluster.md).
	acc := s.accounts()
	acc.KeptChargeIsNoLoss = true
	for _, lost := range acc.Leftovers(ctx, s.gate, settleBound, tenant) {
		t.Errorf("left behind: %s", lost)
	}
	t.Logf("%d requests kept their whole charge: %v", len(acc.Kept), acc.Kept)
	for i := range 2 {
		if r := s.send(ctx, s.apis[i], chatclient.Request{MaxTokens: 10}); r.Terminal != "done" {
			t.Errorf("after the failovers, through %s: %s", s.apis[i].Name, r.Summary())
		}
	}
}

// describe says where a request's workflow is: its status, pending
// activities and last events.
func (s *stack) describe(ctx context.Context, id string) string {
	if id == "" {
		return "(no request id)"
	}
	var b strings.Builder
	desc, err := s.tc.DescribeWorkflow(ctx, workflows.ChatWorkflowID(id), "")
	if err != nil {
		return fmt.Sprintf("describe %s: %v", id, err)
	}
	d := desc.RawResponse
	fmt.Fprintf(&b, "  workflow %s\n", d.GetWorkflowExecutionInfo().GetStatus())
	for _, a := range d.GetPendingActivities() {
		fmt.Fprintf(&b, "  pending %s attempt %d state %s last failure %q\n", a.GetActivityType().GetName(), a.GetAttempt(), a.GetState(), a.GetLastFailure().GetMessage())
	}
	it := s.tc.GetWorkflowHistory(ctx, workflows.ChatWorkflowID(id), "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for it.HasNext() {
		ev, err := it.Next()
		if err != nil {
			break
		}
		fmt.Fprintf(&b, "  %d %s %s\n", ev.GetEventId(), ev.GetEventTime().AsTime().Format("15:04:05.000"), ev.GetEventType())
	}
	return b.String()
}

// masterOf is the address of the master serving key.
func (s *stack) masterOf(ctx context.Context, key string) (string, error) {
	slot, err := s.rdb.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		return "", fmt.Errorf("slot of %s: %w", key, err)
	}
	shards, err := s.rdb.ClusterShards(ctx).Result()
	if err != nil {
		return "", fmt.Errorf("cluster shards: %w", err)
	}
	for _, sh := range shards {
		for _, r := range sh.Slots {
			if r.Start <= slot && slot <= r.End {
				if m, ok := shardNode(sh, "master"); ok {
					return m, nil
				}
			}
		}
	}
	return "", fmt.Errorf("no master serves slot %d", slot)
}

// replicaOf is the address of a replica of the master at addr, waiting
// for one to be listed online (a new cluster's replicas are once they
// have synced).
func (s *stack) replicaOf(ctx context.Context, addr string) (string, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		shards, err := s.rdb.ClusterShards(ctx).Result()
		if err != nil {
			return "", fmt.Errorf("cluster shards: %w", err)
		}
		for _, sh := range shards {
			if m, _ := shardNode(sh, "master"); m == addr {
				if r, ok := shardNode(sh, "replica"); ok {
					return r, nil
				}
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("master %s has no replica online", addr)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// shardNode is the address of a shard's online node in role.
func shardNode(sh redis.ClusterShard, role string) (string, bool) {
	for _, n := range sh.Nodes {
		if n.Role == role && n.Health == "online" {
			return fmt.Sprintf("%s:%d", n.IP, n.Port), true
		}
	}
	return "", false
}

func nodeClient(addr string) *redis.Client { return redis.NewClient(&redis.Options{Addr: addr}) }

// waitRole waits until the node at addr reports role (INFO replication).
func waitRole(ctx context.Context, addr, role string, within time.Duration) error {
	c := nodeClient(addr)
	defer c.Close()
	deadline := time.Now().Add(within)
	for {
		info, err := c.Info(ctx, "replication").Result()
		if err == nil && strings.Contains(info, "role:"+role+"\r\n") {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not %s after %s: %v", addr, role, within, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
