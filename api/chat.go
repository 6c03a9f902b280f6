package api

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/labstack/echo/v4"
	"github.com/oklog/ulid/v2"
	"go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/sluice-dev/sluice/pkg/openai"
	"github.com/sluice-dev/sluice/workflows"
)

// chatRequest is the body of POST /v1/chat.
type chatRequest struct {
	Query     string `json:"query"`
	KB        string `json:"kb"`
	SessionID string `json:"session_id"`
	MaxTokens *int   `json:"max_tokens"`

	// kbTenant owns KB, "" for a shared kb (see Server.resolveChatKB).
	kbTenant string

	// queryTokens is the query's token count once counted (see
	// Server.queryTokens); 0 until then.
	queryTokens int
	counted     bool

	// What only the OpenAI endpoint sets (see workflows.ChatInput):
	// the client's conversation, sent whole; gateway, no knowledge base;
	// sampling, forwarded. model is the backend model the client named
	// ("" when it asked for a kb by alias: any pool answers).
	conversation []openai.Message
	gateway      bool
	sampling     *openai.Sampling
	model        string
	// promptTokens counts the conversation (text, media parts estimated,
	// tool definitions); mediaParts and partTypes are its parts that are
	// not text.
	promptTokens int
	mediaParts   int
	partTypes    []string
	// pool is the pool the door routed the request to.
	pool string
	// choices is how many answers an OpenAI client asked for (n); 0 on
	// Sluice's own API, which answers once.
	choices int
}

// cacheable reports whether the answer to req depends only on its kb,
// query and max tokens, the answer cache's key: not on a conversation,
// a session or generation parameters.
func (req *chatRequest) cacheable() bool {
	if req.SessionID != "" || req.gateway || req.sampling != nil || req.choices > 1 {
		return false
	}
	return req.conversation == nil || (len(req.conversation) == 1 && req.mediaParts == 0)
}

var sessionIDPattern = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,128}$`)

// validate normalises and checks a chat request.
func (s *Server) validate(req *chatRequest) error {
	if err := s.validateMaxTokens(req); err != nil {
		return err
	}
	if req.conversation != nil {
		if err := s.checkConversation(req); err != nil {
			return err
		}
		if req.gateway {
			return s.fitsLongPool(req.promptTokens, true)
		}
	}
	req.Query = strings.TrimSpace(req.Query)
	if req.Query == "" {
		return badRequest("empty_query", "query must not be empty")
	}
	if !utf8.ValidString(req.Query) {
		return badRequest("bad_query", "query must be valid UTF-8")
	}
	if n := utf8.RuneCountInString(req.Query); n > s.cfg.API.MaxQueryChars {
		return &apiError{Status: http.StatusRequestEntityTooLarge, Code: "query_too_long",
			Message: fmt.Sprintf("query has %d characters; the limit is %d", n, s.cfg.API.MaxQueryChars)}
	}
	if req.KB == "" {
		req.KB = s.cfg.Retrieval.DefaultKB
	}
	if req.SessionID != "" && !sessionIDPattern.MatchString(req.SessionID) {
		return badRequest("bad_session_id", "session_id must be 1-128 characters of letters, digits and ._:-")
	}
	if req.conversation != nil {
		// The conversation, the query in it, must fit the long pool
		// with the system prompt, whatever context is shed.
		return s.fitsLongPool(s.prompts.BoundForQueryTokens(req.promptTokens, 0, 0), true)
	}
	// The query alone must fit the long pool, whatever context is shed.
	// A token is at least one byte, so a query of few bytes cannot be too
	// long and is not counted here (a tiktoken encode is most of what a
	// refused request costs).
	if s.prompts.BoundForQueryTokens(len(req.Query), 0, 0) <= s.cfg.Pools.Long.MaxPromptTokens {
		return nil
	}
	return s.fitsLongPool(s.prompts.BoundForQueryTokens(s.queryTokens(req), 0, 0), false)
}

// validateMaxTokens defaults and checks the answer's cap.
func (s *Server) validateMaxTokens(req *chatRequest) error {
	if req.MaxTokens == nil {
		n := s.cfg.API.DefaultMaxTokens
		req.MaxTokens = &n
	}
	if *req.MaxTokens < 1 || *req.MaxTokens > s.cfg.API.MaxTokensLimit {
		return badRequest("bad_max_tokens", "max_tokens must be between 1 and %d", s.cfg.API.MaxTokensLimit)
	}
	return nil
}

// fitsLongPool refuses a prompt of tokens that not even the long pool
// takes: a query, or an OpenAI client's conversation, refused as OpenAI
// refuses one too long for its model.
func (s *Server) fitsLongPool(tokens int, conversation bool) error {
	limit := s.cfg.Pools.Long.MaxPromptTokens
	switch {
	case tokens <= limit:
		return nil
	case conversation:
		return &apiError{Status: http.StatusBadRequest, Code: "context_length_exceeded", Param: "messages",
			Message: fmt.Sprintf("the largest prompt any model here takes is %d tokens; the messages need %d", limit, tokens)}
	}
	return &apiError{Status: http.StatusRequestEntityTooLarge, Code: "query_too_long",
		Message: fmt.Sprintf("the query needs %d prompt tokens; the limit is %d", tokens, limit)}
}

// queryTokens counts the query's tokens once per request.
func (s *Server) queryTokens(req *chatRequest) int {
	if !req.counted {
		req.queryTokens, req.counted = s.prompts.QueryTokens(req.Query), true
	}
	return req.queryTokens
}

// newRequestID is a new request's id: a ULID (sortable by time) whose 80
// random bits come from crypto/rand, so that an id cannot be guessed from
// another (ulid.Make's default entropy is math/rand's).
func newRequestID() string { return "chat-" + ulid.MustNew(ulid.Now(), rand.Reader).String() }

var requestIDPattern = regexp.MustCompile(`^chat-[0-9A-HJKMNP-TV-Z]{26}$`)

func (s *Server) postChat(c echo.Context) error {
	who, err := s.authenticateChat(c)
	if err != nil {
		return err
	}
	var req chatRequest
	if err := s.decodeJSON(c, &req); err != nil {
		return err
	}
	if err := s.validate(&req); err != nil {
		return err
	}
	id, sub, err := s.beginChat(c, who, &req, fingerprintOf(c.Path(), req.Query, req.KB, req.SessionID, *req.MaxTokens))
	if err != nil {
		return err
	}
	defer sub.Close()
	return s.stream(c, sub, id)
}

// startChat starts the request's workflow with the settings of its tier,
// after it waited at the door for waited.
func (s *Server) startChat(ctx context.Context, d door, req chatRequest, waited time.Duration) error {
	cfg := s.cfg
	in := workflows.ChatInput{
		RequestID: d.id, Tenant: d.who.Tenant, User: d.who.User, Tier: d.who.Tier,
		Query: req.Query, KB: req.KB, KBTenant: req.kbTenant, SessionID: req.SessionID, MaxTokens: *req.MaxTokens,
		Pool: d.pool, RateReservation: d.reservation, AdmissionTokens: d.tokens, Settings: workflows.ChatSettingsFor(cfg, d.tier),
		Conversation: req.conversation, Gateway: req.gateway, Sampling: req.sampling,
	}
	if req.choices > 1 {
		in.Choices = req.choices
	}
	if waited > 0 {
		// The door's wait counts against the request's max wait.
		in.Settings.MaxWait, in.Settings.MaxWaitByPool = s.maxWait(d)-waited, nil
	}
	// An answer that depends on a conversation is that conversation's
	// own: requests in a session neither read nor fill the answer cache.
	in.Settings.AnswerCache = s.answerKBs[req.kbRef().Key()] && req.cacheable()
	// No workflow execution timeout: every wait inside the workflow is
	// bounded (max_wait, LLM timeouts and attempts, local activity
	// deadlines), and a timeout would cost the server a timer per request.
	opts := client.StartWorkflowOptions{
		ID:                    workflows.ChatWorkflowID(d.id),
		TaskQueue:             cfg.Temporal.TaskQueue,
		EnableEagerStart:      cfg.Temporal.EagerStart,
		WorkflowIDReusePolicy: enums.WORKFLOW_ID_REUSE_POLICY_REJECT_DUPLICATE,
	}
	if cfg.Temporal.SearchAttributes {
		opts.TypedSearchAttributes = temporal.NewSearchAttributes(workflows.SearchTenant.ValueSet(d.who.Tenant))
	}
	// Not the request's context: a client that leaves mid-call must not
	// leave a started workflow we believe failed. If it left, streaming
	// notices at once and detaches.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_, err := s.temporal.ExecuteWorkflow(sctx, opts, workflows.ChatWorkflowName, in)
	if err != nil && s.startedAnyway(d.id) {
		// The start timed out or its reply was lost, but the server
		// started it: the request runs, and its client follows it.
		s.logger.Warn("workflow start reported an error but the workflow exists; following it", "requestID", d.id, "err", err)
		return nil
	}
	return err
}

// startedAnyway resolves a start whose outcome is unknown by its id: a
// request that runs must not be told it failed (it would run for nobody,
// and its client would retry it), nor one that does not be followed.
func (s *Server) startedAnyway(id string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := s.temporal.DescribeWorkflow(ctx, workflows.ChatWorkflowID(id), "")
	return err == nil
}
