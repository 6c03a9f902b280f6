package integration

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"go.temporal.io/api/enums/v1"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/api/temporalproto"
	"go.temporal.io/sdk/client"
	"google.golang.org/protobuf/proto"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/pkg/codec"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/tests/testenv"
	"github.com/sluice-dev/sluice/workflows"
)

// codecAdminKey guards the encrypted stack's codec endpoint.
const codecAdminKey = "it-codec-admin"

// startEncryptedStack runs a second API process (with its embedded
// worker) on the package's Temporal server and Redis with codec.enabled
// and the test key; its own task queue and key prefix keep it apart from
// the package's stack, which runs without the codec. It returns its URL.
func startEncryptedStack(t *testing.T) string {
	t.Helper()
	cfg := stack.cfg
	cfg.Temporal.TaskQueue = "sluice-encrypted"
	cfg.Redis.KeyPrefix = "itenc:"
	cfg.Metrics.Addr = "" // the package stack's API holds its port
	cfg.Auth.AdminKey = codecAdminKey
	cfg.Codec = codecTestConfig()
	// Its worker starts a healer of its own (named by the task queue), so
	// that the healing workflow's payloads are sealed too.
	cfg.Healing.Enabled = true
	cfg.Healing.Interval = time.Second
	cfg.Healing.Window, cfg.Healing.Cooldown = 3*time.Second, 3*time.Second
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	api, err := app.StartAPI(ctx, cfg, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := api.Stop(20 * time.Second); err != nil {
			t.Error(err)
		}
	})
	return api.URL
}

// askAt sends one chat request to the API at base and reads its stream
// to the done event; it returns the request id.
func askAt(t *testing.T, base, query string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat", strings.NewReader(`{"query":"`+query+`","max_tokens":30}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer k-acme")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("POST %s/v1/chat: %d %s", base, resp.StatusCode, b)
	}
	r := testenv.NewSSEReader(resp.Body)
	for {
		ev, err := r.Next()
		if err != nil {
			t.Fatalf("stream ended before its end: %v", err)
		}
		if events.Terminal(ev.Event) {
			if ev.Event != events.TypeDone {
				t.Fatalf("the request ended with %s: %s", ev.Event, ev.Data)
			}
			return resp.Header.Get("X-Request-ID")
		}
	}
}

// rawHistory is a closed workflow's history as the Temporal server holds
// it, read with a client that has no codec, in protobuf's binary form: a
// payload's bytes appear in it as they are stored.
func rawHistory(t *testing.T, workflowID string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		d, err := stack.temporal.DescribeWorkflow(ctx, workflowID, "")
		if err != nil {
			t.Fatalf("describe %s: %v", workflowID, err)
		}
		if d.Status != enums.WORKFLOW_EXECUTION_STATUS_RUNNING {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	hist := &historypb.History{}
	it := stack.temporal.GetWorkflowHistory(ctx, workflowID, "", false, 0)
	for it.HasNext() {
		ev, err := it.Next()
		if err != nil {
			t.Fatalf("read history of %s: %v", workflowID, err)
		}
		hist.Events = append(hist.Events, ev)
	}
	raw, err := proto.Marshal(hist)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// cliHistory is the history `temporal workflow show --output json`
// printed, in protobuf's binary form: payloads as the CLI shows them,
// not base64.
func cliHistory(t *testing.T, out string) []byte {
	t.Helper()
	hist := &historypb.History{}
	if err := (temporalproto.CustomJSONUnmarshalOptions{DiscardUnknown: true}).Unmarshal([]byte(out), hist); err != nil {
		t.Fatalf("read the CLI's history: %v\n%.1000s", err, out)
	}
	if len(hist.Events) == 0 {
		t.Fatalf("the CLI printed no events:\n%.1000s", out)
	}
	raw, err := proto.Marshal(hist)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// temporalCLI runs the pinned Temporal CLI against the package's server.
func temporalCLI(t *testing.T, args ...string) string {
	t.Helper()
	bin, err := testenv.TemporalBin()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	args = append(args, "--address", stack.cfg.Temporal.HostPort, "--namespace", stack.cfg.Temporal.Namespace)
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("temporal %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// With the codec on, the Temporal server holds ciphertext: the prompt is
// in no event of the chat's history, while the same prompt sent to the
// stack without the codec is. The Temporal CLI shows the history in the
// clear through the API's codec endpoint with the admin key, and not
// without it.
func TestEncryptedHistory(t *testing.T) {
	base := startEncryptedStack(t)
	secret := fmt.Sprintf("bluebird-%d", time.Now().UnixNano())

	plainID := askAt(t, stack.baseURL, "what is redis? "+secret+"-plain")
	if !bytes.Contains(rawHistory(t, workflows.ChatWorkflowID(plainID)), []byte(secret+"-plain")) {
		t.Fatal("without the codec the prompt is not in the history either: this test cannot tell")
	}

	id := askAt(t, base, "what is redis? "+secret)
	wfID := workflows.ChatWorkflowID(id)
	raw := rawHistory(t, wfID)
	if bytes.Contains(raw, []byte(secret)) {
		t.Fatal("the encrypted stack's history holds the prompt in the clear")
	}
	if !bytes.Contains(raw, []byte("binary/encrypted")) || !bytes.Contains(raw, []byte(testenv.CodecTestKeyID)) {
		t.Fatal("the history holds no sealed payload naming its key")
	}

	sealed := cliHistory(t, temporalCLI(t, "workflow", "show", "--workflow-id", wfID, "--output", "json"))
	if bytes.Contains(sealed, []byte(secret)) || !bytes.Contains(sealed, []byte("binary/encrypted")) {
		t.Fatal("the CLI without the codec endpoint shows the prompt, or no sealed payload")
	}
	opened := cliHistory(t, temporalCLI(t, "workflow", "show", "--workflow-id", wfID, "--output", "json",
		"--codec-endpoint", base+"/codec", "--codec-auth", "Bearer "+codecAdminKey))
	if !bytes.Contains(opened, []byte(secret)) || bytes.Contains(opened, []byte("binary/encrypted")) {
		t.Fatal("the CLI with the codec endpoint does not show the prompt, or still shows sealed payloads")
	}
	// A wrong key is refused: the CLI shows nothing in the clear.
	bin, _ := testenv.TemporalBin()
	out, _ := exec.Command(bin, "workflow", "show", "--workflow-id", wfID, "--output", "json", "--address", stack.cfg.Temporal.HostPort,
		"--codec-endpoint", base+"/codec", "--codec-auth", "Bearer wrong").CombinedOutput()
	if bytes.Contains(out, []byte(secret)) || bytes.Contains(out, []byte("d2hhdCBpcyByZWRpcz8g")) { // "what is redis? "
		t.Fatalf("the codec endpoint opened payloads for a wrong key:\n%.1000s", out)
	}

	if testenv.RecordingHistories() {
		saveHistory(t, wfID, "encrypted/chat_done")
	}
	checkEncryptedHealer(t)
}

// checkEncryptedHealer reads the encrypted stack's healer through a
// client with the codec (its query answer), signals it, and finds its
// history sealed.
func checkEncryptedHealer(t *testing.T) {
	t.Helper()
	ring, err := codec.NewKeyring(testenv.CodecTestKeyID, codec.Key{ID: testenv.CodecTestKeyID, Secret: testenv.CodecTestKeySecret})
	if err != nil {
		t.Fatal(err)
	}
	opts := client.Options{HostPort: stack.cfg.Temporal.HostPort, Namespace: stack.cfg.Temporal.Namespace, Logger: testenv.QuietLogger{}}
	ring.Apply(&opts)
	tc, err := client.Dial(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	id := workflows.HealingWorkflowID("sluice-encrypted")
	t.Cleanup(func() { _ = tc.TerminateWorkflow(context.Background(), id, "", "test over") })
	for {
		var st workflows.HealingStatus
		v, err := tc.QueryWorkflow(ctx, id, "", workflows.QueryHealing)
		if err == nil && v.Get(&st) == nil && st.Polls >= 2 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the encrypted stack's healer never polled twice: %v %+v", err, st)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err := tc.SignalWorkflow(ctx, id, "", workflows.SignalOverride, workflows.OverrideSignal{Pool: "long", Level: workflows.LevelShrink}); err != nil {
		t.Fatal(err)
	}
	if err := tc.SignalWorkflow(ctx, id, "", workflows.SignalPause, nil); err != nil {
		t.Fatal(err)
	}
	for {
		var st workflows.HealingStatus
		v, err := tc.QueryWorkflow(ctx, id, "", workflows.QueryHealing)
		if err == nil && v.Get(&st) == nil && st.Paused && st.Pools[1].Overridden {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the override and pause never showed: %v %+v", err, st)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Terminated first: a closed history replays to its end.
	if err := tc.TerminateWorkflow(ctx, id, "", "recorded"); err != nil {
		t.Fatal(err)
	}
	raw := rawHistory(t, id)
	if !bytes.Contains(raw, []byte("binary/encrypted")) || bytes.Contains(raw, []byte(`"Pool":"long"`)) {
		t.Fatal("the healer's history is not sealed: its override signal is in the clear")
	}
	if testenv.RecordingHistories() {
		saveHistory(t, id, "encrypted/healing_override_pause")
	}
}

// codecTestConfig is codec: on with the test key (testenv.CodecTestKeyID), as a stack under test
// sets it.
func codecTestConfig() config.Codec {
	return config.Codec{Enabled: true, ActiveKey: testenv.CodecTestKeyID,
		Keys: []config.CodecKey{{ID: testenv.CodecTestKeyID, Secret: testenv.CodecTestKeySecret}}}
}
