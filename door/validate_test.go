package door_test

import (
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/door"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/openai"
	"github.com/sluice-dev/sluice/pkg/refusal"
)

func intp(n int) *int { return &n }

func conversation(text string) []openai.Message {
	return []openai.Message{openai.TextMessage("user", text)}
}

// Every refusal of Validate, with its class, code, the field at fault
// and what its message must say.
func TestValidateRefuses(t *testing.T) {
	s := newStack(t, func(c *config.Config) { c.Pools.Long.MaxPromptTokens = 600 })
	long := strings.Repeat("word ", 700)
	cases := []struct {
		name                 string
		req                  door.Request
		class                refusal.Class
		code, param, message string
	}{
		{"empty query", door.Request{Query: " \t\n "}, refusal.Invalid, "empty_query", "", "must not be empty"},
		{"no query", door.Request{}, refusal.Invalid, "empty_query", "", ""},
		{"query not UTF-8", door.Request{Query: "caf\xe9"}, refusal.Invalid, "bad_query", "", "UTF-8"},
		{"query of too many characters", door.Request{Query: strings.Repeat("é", 4001)}, refusal.TooLarge, "query_too_long", "",
			"4001 characters; the limit is 4000"},
		{"query too long for the long pool", door.Request{Query: long}, refusal.TooLarge, "query_too_long", "", "the limit is 600"},
		{"session id with a space", door.Request{Query: "hi", SessionID: "a b"}, refusal.Invalid, "bad_session_id", "", ""},
		{"session id too long", door.Request{Query: "hi", SessionID: strings.Repeat("s", 129)}, refusal.Invalid, "bad_session_id", "", ""},
		{"max_tokens 0", door.Request{Query: "hi", MaxTokens: intp(0)}, refusal.Invalid, "bad_max_tokens", "", "between 1 and 2048"},
		{"max_tokens negative", door.Request{Query: "hi", MaxTokens: intp(-5)}, refusal.Invalid, "bad_max_tokens", "", ""},
		{"max_tokens over the limit", door.Request{Query: "hi", MaxTokens: intp(2049)}, refusal.Invalid, "bad_max_tokens", "", ""},
		{"max_tokens checked first", door.Request{MaxTokens: intp(0)}, refusal.Invalid, "bad_max_tokens", "", ""},
		{"gateway conversation too long", door.Request{Conversation: conversation(long), Gateway: true, Model: "sluice-sim"},
			refusal.Invalid, "context_length_exceeded", "messages", "takes is 600 tokens"},
		{"media parts counted as tokens", door.Request{Conversation: conversation("hi"), MediaParts: 1, MediaTokens: door.MediaPartTokens, Gateway: true, Model: "sluice-sim"},
			refusal.Invalid, "context_length_exceeded", "messages", ""},
		{"kb conversation too long", door.Request{Conversation: conversation(long), Query: "word"},
			refusal.Invalid, "context_length_exceeded", "messages", ""},
		{"kb conversation without a query", door.Request{Conversation: conversation("hi")}, refusal.Invalid, "empty_query", "", ""},
		{"unknown model", door.Request{Conversation: conversation("hi"), Gateway: true, Model: "gpt-nope"},
			refusal.NotFound, "model_not_found", "model", `"gpt-nope" is not served here`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req := c.req
			e := refusalOf(t, s.door.Validate(&req))
			if e.Class != c.class || e.Code != c.code || e.Param != c.param {
				t.Fatalf("refused %v %s (param %q), want %v %s (param %q)", e.Class, e.Code, e.Param, c.class, c.code, c.param)
			}
			if !strings.Contains(e.Message, c.message) {
				t.Errorf("message %q lacks %q", e.Message, c.message)
			}
		})
	}
}

// What Validate lets through, normalised: the query trimmed, the default
// kb and max_tokens filled in, characters (not bytes) counted.
func TestValidateAcceptsAndNormalises(t *testing.T) {
	s := newStack(t, nil)
	cases := []struct {
		name      string
		req       door.Request
		query, kb string
		maxTokens int
	}{
		{"defaults", door.Request{Query: "  what is a permit?\n"}, "what is a permit?", "sluice-docs", 128},
		{"the caller's kb and max_tokens", door.Request{Query: "hi", KB: "mine", MaxTokens: intp(2048)}, "hi", "mine", 2048},
		{"characters, not bytes", door.Request{Query: strings.Repeat("é", 4000)}, strings.Repeat("é", 4000), "sluice-docs", 128},
		{"a valid session id", door.Request{Query: "hi", SessionID: "s-1.a:b_c", MaxTokens: intp(1)}, "hi", "sluice-docs", 1},
		{"a gateway request has no query and no kb", door.Request{Conversation: conversation("hi"), Gateway: true, Model: "sluice-sim"},
			"", "", 128},
		{"a kb conversation", door.Request{Conversation: conversation("hi"), Query: " hi "}, "hi", "sluice-docs", 128},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req := c.req
			if err := s.door.Validate(&req); err != nil {
				t.Fatal(err)
			}
			if req.Query != c.query || req.KB != c.kb || req.MaxTokens == nil || *req.MaxTokens != c.maxTokens {
				t.Fatalf("validated as query %q kb %q max_tokens %v, want %q %q %d", req.Query, req.KB, req.MaxTokens, c.query, c.kb, c.maxTokens)
			}
		})
	}
}

func TestValidSessionID(t *testing.T) {
	for id, want := range map[string]bool{
		"s1": true, "A-b_c.d:e": true, strings.Repeat("x", 128): true,
		"": false, "a b": false, "a/b": false, "é": false, strings.Repeat("x", 129): false, "a\n": false,
	} {
		if got := door.ValidSessionID(id); got != want {
			t.Errorf("ValidSessionID(%q) = %v, want %v", id, got, want)
		}
	}
}

// Request ids are new each time and of the one form ValidRequestID takes;
// nothing else passes for one.
func TestRequestIDs(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		id := door.NewRequestID()
		if !door.ValidRequestID(id) || seen[id] {
			t.Fatalf("new request id %q: valid %v, seen before %v", id, door.ValidRequestID(id), seen[id])
		}
		seen[id] = true
	}
	good := door.NewRequestID()
	for _, id := range []string{
		"", "chat-", strings.ToLower(good), "emb-" + strings.TrimPrefix(good, "chat-"), good + "0", good[:len(good)-1],
		"chat-0123456789ABCDEFGHJKMNPQRU", // U is not Crockford base32
		"chat-0123456789ABCDEFGHJKMNPQR/",
	} {
		if door.ValidRequestID(id) {
			t.Errorf("ValidRequestID(%q) = true", id)
		}
	}
}

// A retry's body is compared by its route and its decoded parts: equal
// parts give one fingerprint, any difference another.
func TestFingerprint(t *testing.T) {
	base := door.Fingerprint("/v1/chat", "hello", "sluice-docs", "", 128)
	if base != door.Fingerprint("/v1/chat", "hello", "sluice-docs", "", 128) {
		t.Fatal("the same request fingerprinted twice differs")
	}
	for name, fp := range map[string]string{
		"another route":      door.Fingerprint("/v1/chat/completions", "hello", "sluice-docs", "", 128),
		"another query":      door.Fingerprint("/v1/chat", "hello!", "sluice-docs", "", 128),
		"another kb":         door.Fingerprint("/v1/chat", "hello", "mine", "", 128),
		"a session":          door.Fingerprint("/v1/chat", "hello", "sluice-docs", "s1", 128),
		"another max_tokens": door.Fingerprint("/v1/chat", "hello", "sluice-docs", "", 129),
		"parts shifted":      door.Fingerprint("/v1/chat", "hellosluice-docs", "", "", 128),
	} {
		if fp == base {
			t.Errorf("%s: same fingerprint", name)
		}
	}
	msgs := conversation("hi")
	if door.Fingerprint("/v1/chat/completions", msgs) != door.Fingerprint("/v1/chat/completions", conversation("hi")) {
		t.Error("equal conversations fingerprint differently")
	}
}

// The door refuses to be built without what every request needs.
func TestNewRequiresItsDependencies(t *testing.T) {
	if _, err := door.New(door.Options{}); err == nil || !strings.Contains(err.Error(), "required") {
		t.Fatalf("New with nothing: %v", err)
	}
}

// A door the process drains still validates and admits at once; only
// requests waiting at it end (see the waiting-room tests).
func TestDrainedDoorStillAdmitsAtOnce(t *testing.T) {
	s := newStack(t, nil)
	s.door.Drain()
	adm := s.admit(acme, s.request("hello", 16))
	if adm.ID == "" || len(s.temporal.inputs()) != 1 {
		t.Fatalf("admission %+v, %d starts", adm, len(s.temporal.inputs()))
	}
}
