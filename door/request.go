package door

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"unicode/utf8"

	"github.com/oklog/ulid/v2"

	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/openai"
	"github.com/sluice-dev/sluice/pkg/refusal"
	"github.com/sluice-dev/sluice/pkg/request"
)

// ParamServiceTier is the request field that asks for a service class,
// as both APIs spell it, which a refusal of the class names.
const ParamServiceTier = "service_tier"

// Request is a chat request as the door takes it, whichever API it came
// through: Sluice's own (a query, a kb, a session) or the OpenAI
// endpoint's (a conversation, a model, sampling).
type Request struct {
	Query     string
	KB        string
	SessionID string
	// MaxTokens caps the answer; nil takes api.default_max_tokens.
	MaxTokens *int

	// kbTenant owns KB, "" for a shared kb (see Door.resolveChatKB).
	kbTenant string

	// queryTokens is the query's token count once counted (see
	// Door.queryTokens); 0 until then.
	queryTokens int
	counted     bool

	// What only the OpenAI endpoint sets (see workflows.ChatInput):
	// the client's conversation, sent whole; gateway, no knowledge base;
	// sampling, forwarded. Model is the backend model the client named
	// ("" when it asked for a kb by alias: any pool answers).
	Conversation []openai.Message
	Gateway      bool
	Sampling     *openai.Sampling
	Model        string
	// MediaParts and PartTypes are the conversation's parts that are not
	// text, and MediaTokens what they count as (the door counts the
	// prompt's text; each part is estimated where it is read, MediaTokens).
	MediaParts  int
	MediaTokens int
	PartTypes   []string
	// Choices is how many answers an OpenAI client asked for (n); 0 on
	// Sluice's own API, which answers once.
	Choices int
	// Response is the Responses API's Response as asked, when its answer
	// is to be stored (workflows.ChatInput.Response).
	Response json.RawMessage
	// Background is a request no client waits for (a background
	// response): it skips the waiting room, whose waiters live in this
	// process, and waits in its pool's queue, up to
	// responses.background_max_wait; its workflow outlives its readers
	// (workflows.ChatInput.Background).
	Background bool
	// ServiceTier is the service class the client asked for (OpenAI's
	// service_tier, on either API): a class of request.Classes,
	// request.ClassAuto, or "" for none; the caller's plan decides
	// whether it is served in it (Door.Admit).
	ServiceTier string

	// Fingerprint is what a retry's body is compared by (Fingerprint);
	// IdempotencyKey is the client's Idempotency-Key header, "" if none,
	// and LastEventID where a replay of it resumes.
	Fingerprint    string
	IdempotencyKey string
	LastEventID    string

	// promptTokens counts the conversation (text, media parts estimated,
	// tool definitions).
	promptTokens int
	// pool is the pool the door routed the request to; fallback, if set,
	// says it is a fallback of the pool the client's model named, which
	// could not take the prompt.
	pool     string
	fallback *events.Fallback
}

// cacheable reports whether the answer to req depends only on its kb,
// query and max tokens, the answer cache's key: not on a conversation,
// a session or generation parameters.
func (req *Request) cacheable() bool {
	if req.SessionID != "" || req.Gateway || req.Sampling != nil || req.Choices > 1 {
		return false
	}
	return req.Conversation == nil || (len(req.Conversation) == 1 && req.MediaParts == 0)
}

var sessionIDPattern = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,128}$`)

// ValidSessionID reports whether id can name a session.
func ValidSessionID(id string) bool { return sessionIDPattern.MatchString(id) }

// Validate normalises and checks a chat request.
func (d *Door) Validate(req *Request) error {
	if err := d.validateMaxTokens(req); err != nil {
		return err
	}
	if !request.IsServiceTier(req.ServiceTier) {
		return &refusal.Error{Class: refusal.Invalid, Code: "invalid_service_tier", Param: ParamServiceTier,
			Message: fmt.Sprintf("service_tier must be one of %s, got %q", request.ServiceTierValues(), req.ServiceTier)}
	}
	if req.Conversation != nil {
		if err := d.checkConversation(req); err != nil {
			return err
		}
		if req.Gateway {
			return d.fitsLongPool(req.promptTokens, true)
		}
	}
	req.Query = strings.TrimSpace(req.Query)
	if req.Query == "" {
		return refusal.BadRequest("empty_query", "query must not be empty")
	}
	if !utf8.ValidString(req.Query) {
		return refusal.BadRequest("bad_query", "query must be valid UTF-8")
	}
	if n := utf8.RuneCountInString(req.Query); n > d.cfg.API.MaxQueryChars {
		return &refusal.Error{Class: refusal.TooLarge, Code: "query_too_long",
			Message: fmt.Sprintf("query has %d characters; the limit is %d", n, d.cfg.API.MaxQueryChars)}
	}
	if req.KB == "" {
		req.KB = d.cfg.Retrieval.DefaultKB
	}
	if req.SessionID != "" && !sessionIDPattern.MatchString(req.SessionID) {
		return refusal.BadRequest("bad_session_id", "session_id must be 1-128 characters of letters, digits and ._:-")
	}
	if req.Conversation != nil {
		// The conversation, the query in it, must fit the long pool
		// with the system prompt, whatever context is shed.
		return d.fitsLongPool(d.prompts.BoundForQueryTokens(req.promptTokens, 0, 0), true)
	}
	// The query alone must fit the long pool, whatever context is shed.
	// A token is at least one byte, so a query of few bytes cannot be too
	// long and is not counted here (a tiktoken encode is most of what a
	// refused request costs).
	if d.prompts.BoundForQueryTokens(len(req.Query), 0, 0) <= d.cfg.Pools.Long.MaxPromptTokens {
		return nil
	}
	return d.fitsLongPool(d.prompts.BoundForQueryTokens(d.queryTokens(req), 0, 0), false)
}

// validateMaxTokens defaults and checks the answer's cap.
func (d *Door) validateMaxTokens(req *Request) error {
	if req.MaxTokens == nil {
		n := d.cfg.API.DefaultMaxTokens
		req.MaxTokens = &n
	}
	if *req.MaxTokens < 1 || *req.MaxTokens > d.cfg.API.MaxTokensLimit {
		return refusal.BadRequest("bad_max_tokens", "max_tokens must be between 1 and %d", d.cfg.API.MaxTokensLimit)
	}
	return nil
}

// fitsLongPool refuses a prompt of tokens that not even the long pool
// takes: a query, or an OpenAI client's conversation, refused as OpenAI
// refuses one too long for its model.
func (d *Door) fitsLongPool(tokens int, conversation bool) error {
	limit := d.cfg.Pools.Long.MaxPromptTokens
	switch {
	case tokens <= limit:
		return nil
	case conversation:
		return &refusal.Error{Class: refusal.Invalid, Code: "context_length_exceeded", Param: "messages",
			Message: fmt.Sprintf("the largest prompt any model here takes is %d tokens; the messages need %d", limit, tokens)}
	}
	return &refusal.Error{Class: refusal.TooLarge, Code: "query_too_long",
		Message: fmt.Sprintf("the query needs %d prompt tokens; the limit is %d", tokens, limit)}
}

// queryTokens counts the query's tokens once per request.
func (d *Door) queryTokens(req *Request) int {
	if !req.counted {
		req.queryTokens, req.counted = d.prompts.QueryTokens(req.Query), true
	}
	return req.queryTokens
}

// NewRequestID is a new request's id: a ULID (sortable by time) whose 80
// random bits come from crypto/rand, so that an id cannot be guessed from
// another (ulid.Make's default entropy is math/rand's).
func NewRequestID() string { return "chat-" + NewULID() }

// NewULID is a new ULID: unique, and ordered by its time, as request,
// file and batch ids are.
func NewULID() string { return ulid.MustNew(ulid.Now(), rand.Reader).String() }

var requestIDPattern = regexp.MustCompile(`^chat-[0-9A-HJKMNP-TV-Z]{26}$`)

// ValidRequestID reports whether id can name a request (newRequestID's
// form), before anything is looked up by it.
func ValidRequestID(id string) bool { return requestIDPattern.MatchString(id) }
