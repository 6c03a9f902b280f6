// Package events carries a request's client-visible events (accepted,
// queue, stage, token, done, rejected, error) through one Redis Stream per
// request. Writers are the API and the workflow's activities; readers are SSE
// handlers. Because the stream is durable for events.ttl, a client that
// reconnects with Last-Event-ID resumes exactly after the last event it saw.
package events

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-dev/sluice/pkg/openai"
	"github.com/sluice-dev/sluice/pkg/request"
)

// Event types, as they appear in the SSE "event:" field.
const (
	TypeAccepted = "accepted"
	TypeQueue    = "queue"
	TypeStage    = "stage"
	TypeToken    = "token"
	TypeDone     = "done"
	TypeRejected = "rejected"
	TypeError    = "error"
)

// terminalTypes are the types no event follows.
var terminalTypes = []string{TypeDone, TypeRejected, TypeError}

// Terminal reports whether no event follows an event of this type.
func Terminal(typ string) bool {
	return slices.Contains(terminalTypes, typ)
}

// Event is one stream entry. ID is the Redis stream entry ID, used as the
// SSE "id:" and as Last-Event-ID on reconnect.
type Event struct {
	ID   string
	Type string
	Data json.RawMessage
}

// Accepted is the first event of every request.
type Accepted struct {
	RequestID string `json:"request_id"`
	Tenant    string `json:"tenant"`
	// User is the key's user ("" for an anonymous caller): only the
	// tenant and user who sent a request may read or cancel it.
	User string `json:"user,omitempty"`
	KB   string `json:"kb"`
	// ServiceTier is the service class the request is served in
	// (request.Classes): what it asked for, or its plan's default.
	ServiceTier string `json:"service_tier,omitempty"`
}

// Queue reports the request's place in the admission queue.
type Queue struct {
	Position        int    `json:"position"`
	EstimatedWaitMs int64  `json:"estimated_wait_ms"`
	Pool            string `json:"pool"`
}

// Stage reports that a pipeline stage began.
type Stage struct {
	Stage string `json:"stage"`
	Pool  string `json:"pool,omitempty"`
}

// Token is one streamed piece of the answer.
type Token struct {
	Text  string `json:"text"`
	Index int    `json:"index"`
	// ToolCalls are pieces of the tool calls the model asks for, which a
	// token may carry instead of text (OpenAI's delta.tool_calls).
	ToolCalls []openai.ToolCallDelta `json:"tool_calls,omitempty"`
	// Model is the model that answers, as the backend named it, on the
	// first token only (where it is known).
	Model string `json:"model,omitempty"`
	// Choice is the answer the token belongs to when the client asked for
	// several (OpenAI's n); 0 otherwise.
	Choice int `json:"choice,omitempty"`
	// Notice marks text Sluice adds after the model's answer, not the
	// model's own (llm.truncation_notice on an answer cut at max_tokens).
	// The native API streams it so that a reader is told; the OpenAI
	// routes leave it out, since there finish_reason "length" says so and
	// clients parse the content (a json_object answer) as the model sent it.
	Notice bool `json:"notice,omitempty"`
}

// Usage counts the tokens of a finished request.
type Usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
	// Reported is false when the backend sent no usage and the completion
	// count is the number of streamed chunks.
	Reported bool `json:"reported"`
}

// StageTiming is how long one stage took.
type StageTiming struct {
	Stage string `json:"stage"`
	Ms    int64  `json:"ms"`
	// Cache says how a cached stage was served: memory, redis or miss.
	Cache string `json:"cache,omitempty"`
}

// Done ends a request that produced an answer.
type Done struct {
	RequestID    string        `json:"request_id"`
	Route        string        `json:"route"`
	FinishReason string        `json:"finish_reason"`
	Usage        Usage         `json:"usage"`
	Timings      []StageTiming `json:"timings"`
	KBVersion    int64         `json:"kb_version"`
	// Sources are the documents the answer's context came from.
	Sources []string `json:"sources,omitempty"`
	// ContextShed counts context chunks dropped so the prompt fit its pool.
	ContextShed int `json:"context_shed,omitempty"`
	// Cached: the answer came from the answer cache (L3), with no LLM call.
	Cached bool `json:"cached,omitempty"`
	// Model is the model that answered, as the backend named it (the
	// pool's configured model when it named none); empty for a cached
	// answer.
	Model string `json:"model,omitempty"`
	// FinishReasons are every choice's, by index, when the client asked
	// for several (FinishReason is the first's).
	FinishReasons []string `json:"finish_reasons,omitempty"`
	// TraceID is the request's OpenTelemetry trace, when tracing is on:
	// the one to look up in the tracing backend.
	TraceID string `json:"trace_id,omitempty"`
	// Fallback, if set, says that the request's pool could not answer
	// before a first token and a fallback did (the last step, when it
	// took several).
	Fallback *Fallback `json:"fallback,omitempty"`
	// ServiceTier is the service class the request was served in
	// (request.Classes), as OpenAI's service_tier names it.
	ServiceTier string `json:"service_tier,omitempty"`
	// Pauses is how often the stream was paused for a more urgent
	// request and continued (preemption by continuation; 0 when never).
	Pauses int `json:"pauses,omitempty"`
}

// Fallback is one step from a pool that could not answer to its fallback
// (pools.<pool>.fallbacks): from which model and pool, to which, and why
// (request.ReasonBackendUnavailable, request.FallbackContextTooLong,
// request.FallbackFirstTokenTimeout).
type Fallback struct {
	From     string `json:"from"`
	To       string `json:"to"`
	FromPool string `json:"from_pool"`
	ToPool   string `json:"to_pool"`
	Reason   string `json:"reason"`
}

// Failure is the payload of rejected and error events; request.Refused
// builds a refusal's.
type Failure = request.Failure

// Log appends to and reads request event streams. It is the one place
// that names the keys of a request's events.
type Log struct {
	rdb    redis.UniversalClient
	prefix string
	ttl    time.Duration
	maxLen int64
}

// LogOptions configures a Log.
type LogOptions struct {
	// KeyPrefix namespaces the keys ("sluice:" gives
	// "sluice:ev:{ev:<group>}:<id>"). It must not hold a hash tag of its
	// own: Redis would hash every key by the prefix's tag, putting every
	// stream in one slot.
	KeyPrefix string
	// TTL is how long a stream lives after its last write.
	TTL time.Duration
	// MaxLen caps a stream's length (approximately).
	MaxLen int64
}

// NewLog returns a Log over rdb.
func NewLog(rdb redis.UniversalClient, opts LogOptions) *Log {
	if opts.TTL <= 0 {
		opts.TTL = time.Hour
	}
	if opts.MaxLen <= 0 {
		opts.MaxLen = 20000
	}
	return &Log{rdb: rdb, prefix: opts.KeyPrefix, ttl: opts.TTL, maxLen: opts.MaxLen}
}

// streamGroups is how many groups request streams are spread over. A
// group's keys share a hash tag, {ev:<group>}, so they are in one Redis
// Cluster slot: the Hub reads all the streams of a group in one XREAD,
// which a cluster refuses over keys of several slots. Sixteen groups
// spread the streams over up to sixteen slots (and so over the cluster's
// masters) for at most sixteen blocking reads per Hub. Changing it moves
// every request to another key.
const streamGroups = 16

// groupOf is the stream group of a request: stable across processes and
// releases, since every writer and reader must agree on it.
func groupOf(requestID string) int {
	f := fnv.New32a()
	_, _ = f.Write([]byte(requestID))
	return int(f.Sum32() % streamGroups)
}

// groupTag is the hash tag of a stream group's keys.
func groupTag(group int) string { return "{ev:" + strconv.Itoa(group) + "}" }

// Key returns the stream key of a request, "<prefix>ev:{ev:<group>}:<id>".
//
// Before streams were grouped the key was "<prefix>ev:<id>" (and the stop
// key "<prefix>stop:<id>"). A reader of the new layout does not find a
// stream written under the old one, so during a rolling upgrade a client
// reading a request that an old worker still serves sees no events; the
// API's liveness check then ends its stream with an error event and the
// client retries, as after any lost request.
func (l *Log) Key(requestID string) string {
	return l.prefix + "ev:" + groupTag(groupOf(requestID)) + ":" + requestID
}

// StopKey is the request's stop flag: raised to cancel it wherever it is
// (streaming, or still waiting at the door for its workflow to start),
// read by whoever runs it with every token, and between tokens. It is in
// its stream's slot, so that one call may write the one and read the
// other.
func (l *Log) StopKey(requestID string) string {
	return l.prefix + "stop:" + groupTag(groupOf(requestID)) + ":" + requestID
}

// wakeKey is the stream a Hub writes to interrupt its blocking read of a
// group: one per Hub and group, in the group's slot so that the read can
// include it, and outside the "ev:" keys so that it is not taken for a
// request's stream.
func (l *Log) wakeKey(group int, instance string) string {
	return l.prefix + "hub:" + groupTag(group) + ":" + instance
}

// StreamPattern is the KEYS/SCAN pattern of every request stream.
func (l *Log) StreamPattern() string { return l.prefix + "ev:*" }

// RequestID returns the request whose stream key is key, or ok=false if
// key is not one Key returns.
func (l *Log) RequestID(key string) (id string, ok bool) {
	rest, ok := strings.CutPrefix(key, l.prefix+"ev:")
	if !ok {
		return "", false
	}
	_, id, ok = strings.Cut(rest, "}:")
	if !ok || l.Key(id) != key {
		return "", false
	}
	return id, true
}

// Stop raises the request's stop flag for ttl.
func (l *Log) Stop(ctx context.Context, requestID string, ttl time.Duration) error {
	if err := l.rdb.Set(ctx, l.StopKey(requestID), "1", ttl).Err(); err != nil {
		return fmt.Errorf("raise stop flag of %s: %w", requestID, err)
	}
	return nil
}

// Stopped reports whether the request's stop flag is raised.
func (l *Log) Stopped(ctx context.Context, requestID string) (bool, error) {
	stopped, err := l.StoppedAmong(ctx, []string{requestID})
	if err != nil {
		return false, err
	}
	return stopped[0], nil
}

// StoppedAmong reports, for each of requestIDs, whether its stop flag is
// raised, in one round trip (per cluster node).
func (l *Log) StoppedAmong(ctx context.Context, requestIDs []string) ([]bool, error) {
	pipe := l.rdb.Pipeline()
	cmds := make([]*redis.IntCmd, len(requestIDs))
	for i, id := range requestIDs {
		cmds[i] = pipe.Exists(ctx, l.StopKey(id))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("read the stop flags of %d requests: %w", len(requestIDs), err)
	}
	stopped := make([]bool, len(cmds))
	for i, c := range cmds {
		stopped[i] = c.Val() == 1
	}
	return stopped, nil
}

// Append adds one event and refreshes the stream's TTL, in one round trip.
func (l *Log) Append(ctx context.Context, requestID, typ string, data any) (string, error) {
	ids, err := l.AppendBatch(ctx, requestID, []Pending{{Type: typ, Data: data}})
	if err != nil {
		return "", err
	}
	return ids[0], nil
}

var (
	//go:embed lua/append_final.lua
	appendFinalLua    string
	appendFinalScript = redis.NewScript(appendFinalLua)
)

// finalLookBack is how many of a stream's newest entries AppendFinal
// searches for a terminal one: an end is the last event but for a stray
// queue event a reader may have written just after it.
const finalLookBack = 8

// AppendFinal adds a terminal event (done, rejected, error) unless the
// request's stream already has one, in one atomic step: every writer that
// may end a request (the workflow, a retried Finalize, the door, an API
// instance that found the workflow gone) uses it, so that a client sees
// exactly one end. written is false when an end was there already; id is
// then that end's.
func (l *Log) AppendFinal(ctx context.Context, requestID, typ string, data any) (id string, written bool, err error) {
	return l.AppendFinalAfter(ctx, requestID, nil, typ, data)
}

// AppendFinalAfter is AppendFinal that also appends before, in order, just
// before the terminal event and in the same atomic step: all of them, or,
// when the stream already has an end, none. A cached answer is its tokens
// and its done event, written once however often the writer is retried.
func (l *Log) AppendFinalAfter(ctx context.Context, requestID string, before []Pending, typ string, data any) (id string, written bool, err error) {
	if !Terminal(typ) {
		return "", false, fmt.Errorf("append final event to %s: %q is not a terminal type", requestID, typ)
	}
	raw, err := json.Marshal(data)
	if err != nil {
		return "", false, fmt.Errorf("encode %s event for %s: %w", typ, requestID, err)
	}
	args := []any{typ, raw, l.maxLen, l.ttl.Milliseconds(), finalLookBack, len(terminalTypes)}
	for _, t := range terminalTypes {
		args = append(args, t)
	}
	for _, ev := range before {
		if Terminal(ev.Type) {
			return "", false, fmt.Errorf("append final event to %s: %q before the end is terminal itself", requestID, ev.Type)
		}
		raw, err := json.Marshal(ev.Data)
		if err != nil {
			return "", false, fmt.Errorf("encode %s event for %s: %w", ev.Type, requestID, err)
		}
		args = append(args, ev.Type, raw)
	}
	res, err := appendFinalScript.Run(ctx, l.rdb, []string{l.Key(requestID)}, args...).Slice()
	if err != nil {
		return "", false, fmt.Errorf("append final %s event to %s: %w", typ, requestID, err)
	}
	if len(res) != 2 {
		return "", false, fmt.Errorf("append final %s event to %s: script returned %v", typ, requestID, res)
	}
	id, _ = res[0].(string)
	n, _ := res[1].(int64)
	return id, n == 1, nil
}

// Pending is an event not yet written.
type Pending struct {
	Type string
	Data any
}

// AppendBatch adds events in order in one round trip, all or none (a
// caller that retries a failed batch never leaves half of it twice).
func (l *Log) AppendBatch(ctx context.Context, requestID string, evs []Pending) ([]string, error) {
	key := l.Key(requestID)
	pipe := l.rdb.TxPipeline()
	cmds := make([]*redis.StringCmd, len(evs))
	for i, ev := range evs {
		raw, err := json.Marshal(ev.Data)
		if err != nil {
			return nil, fmt.Errorf("encode %s event for %s: %w", ev.Type, requestID, err)
		}
		cmds[i] = pipe.XAdd(ctx, &redis.XAddArgs{
			Stream: key,
			MaxLen: l.maxLen,
			Approx: true,
			Values: []any{"t", ev.Type, "d", raw},
		})
	}
	pipe.PExpire(ctx, key, l.ttl)
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("append events to %s: %w", key, err)
	}
	ids := make([]string, len(cmds))
	for i, c := range cmds {
		ids[i] = c.Val()
	}
	return ids, nil
}

// Exists reports whether a request has an event stream.
func (l *Log) Exists(ctx context.Context, requestID string) (bool, error) {
	n, err := l.rdb.Exists(ctx, l.Key(requestID)).Result()
	if err != nil {
		return false, fmt.Errorf("check event stream of %s: %w", requestID, err)
	}
	return n == 1, nil
}

// Delete removes a request's stream (used when its workflow failed to start).
func (l *Log) Delete(ctx context.Context, requestID string) error {
	if err := l.rdb.Del(ctx, l.Key(requestID)).Err(); err != nil {
		return fmt.Errorf("delete event stream of %s: %w", requestID, err)
	}
	return nil
}

// After returns up to count events after afterID ("0" or "" for all)
// without blocking.
func (l *Log) After(ctx context.Context, requestID, afterID string, count int64) ([]Event, error) {
	if afterID == "" {
		afterID = "0"
	}
	msgs, err := l.rdb.XRangeN(ctx, l.Key(requestID), "("+afterID, "+", count).Result()
	if err != nil {
		return nil, fmt.Errorf("read events of %s after %s: %w", requestID, afterID, err)
	}
	return decode(msgs), nil
}

// eachPage is how many events one read of Each takes.
const eachPage = 1000

// Each calls fn with every event of a request's log, oldest first,
// reading it a page at a time, and stops at fn's first error.
func (l *Log) Each(ctx context.Context, requestID string, fn func(Event) error) error {
	after := "0"
	for {
		evs, err := l.After(ctx, requestID, after, eachPage)
		if err != nil {
			return err
		}
		for _, ev := range evs {
			if err := fn(ev); err != nil {
				return err
			}
		}
		if len(evs) < eachPage {
			return nil
		}
		after = evs[len(evs)-1].ID
	}
}

// First returns the oldest event of a request (its accepted event), or
// ok=false if it has none.
func (l *Log) First(ctx context.Context, requestID string) (Event, bool, error) {
	msgs, err := l.rdb.XRangeN(ctx, l.Key(requestID), "-", "+", 1).Result()
	return one(msgs, err, "first", requestID)
}

// Tail returns up to n of a request's newest events, newest first.
func (l *Log) Tail(ctx context.Context, requestID string, n int64) ([]Event, error) {
	msgs, err := l.rdb.XRevRangeN(ctx, l.Key(requestID), "+", "-", n).Result()
	if err != nil {
		return nil, fmt.Errorf("read the last %d events of %s: %w", n, requestID, err)
	}
	return decode(msgs), nil
}

// End returns a request's terminal event, or ok=false if it has none, as
// AppendFinal looks for it: among its newest finalLookBack entries, past
// any event a slow writer appended after the end (a queue position read
// just as the request finished).
func (l *Log) End(ctx context.Context, requestID string) (Event, bool, error) {
	evs, err := l.Tail(ctx, requestID, finalLookBack)
	if err != nil {
		return Event{}, false, err
	}
	for _, ev := range evs {
		if Terminal(ev.Type) {
			return ev, true, nil
		}
	}
	return Event{}, false, nil
}

// Last returns the newest event of a request, or ok=false if it has none.
func (l *Log) Last(ctx context.Context, requestID string) (Event, bool, error) {
	msgs, err := l.rdb.XRevRangeN(ctx, l.Key(requestID), "+", "-", 1).Result()
	return one(msgs, err, "last", requestID)
}

// one is the event a range of at most one entry read, if any.
func one(msgs []redis.XMessage, err error, which, requestID string) (Event, bool, error) {
	if err != nil {
		return Event{}, false, fmt.Errorf("read %s event of %s: %w", which, requestID, err)
	}
	evs := decode(msgs)
	if len(evs) == 0 {
		return Event{}, false, nil
	}
	return evs[0], true, nil
}

// CompareIDs orders two valid stream IDs: -1, 0 or 1.
func CompareIDs(a, b string) int { return compareIDs(a, b) }

func decode(msgs []redis.XMessage) []Event {
	out := make([]Event, 0, len(msgs))
	for _, m := range msgs {
		typ, _ := m.Values["t"].(string)
		data, _ := m.Values["d"].(string)
		out = append(out, Event{ID: m.ID, Type: typ, Data: json.RawMessage(data)})
	}
	return out
}

// ValidID reports whether s has the shape of a stream entry ID
// ("<ms>-<seq>"), so that a client's Last-Event-ID can be checked before it
// reaches Redis.
func ValidID(s string) bool {
	ms, seq, ok := strings.Cut(s, "-")
	return ok && uint64Digits(ms) && uint64Digits(seq)
}

// uint64Digits accepts plain decimal digits that fit a uint64, as Redis
// requires of both parts of a stream ID.
func uint64Digits(s string) bool {
	if s == "" || s[0] == '+' {
		return false
	}
	_, err := strconv.ParseUint(s, 10, 64)
	return err == nil
}

// ErrClosed is returned by a Subscription read after the hub stopped.
var ErrClosed = errors.New("event hub closed")

// XAddArgs returns the XADD of one event, for callers that pipeline it with
// other commands. It does not refresh the stream's TTL.
func (l *Log) XAddArgs(requestID, typ string, data any) (*redis.XAddArgs, error) {
	raw, err := json.Marshal(data)
	if err != nil {
		return nil, fmt.Errorf("encode %s event for %s: %w", typ, requestID, err)
	}
	return &redis.XAddArgs{
		Stream: l.Key(requestID),
		MaxLen: l.maxLen,
		Approx: true,
		Values: []any{"t", typ, "d", raw},
	}, nil
}
