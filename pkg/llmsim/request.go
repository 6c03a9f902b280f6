package llmsim

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/sluice-dev/sluice/pkg/openai"
	"github.com/sluice-dev/sluice/pkg/tokens"
)

// parsedChat is a validated request ready for the engine.
type parsedChat struct {
	// model is the name the answer reports: the one the request asked
	// for, or the served model's when it named none.
	model        string
	msgs         []tokens.Message
	promptTokens int
	maxTokens    int
	// n is the number of choices, each a sequence in the engine.
	n            int
	stream       bool
	includeUsage bool
	gen          generation
	// prefix is the text of the final assistant message the request asks
	// to continue (continue_final_message); nil for a new answer.
	prefix *string
	// priority is vLLM's: lower is admitted sooner; 0 when not sent.
	priority int
}

// parseChat decodes and validates a request; the error text is meant for
// the client, and a *requestError names the field at fault. The model is
// not checked: the gateway may name its pools' models freely.
func (s *Server) parseChat(r *http.Request) (parsedChat, error) {
	var req openai.ChatRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		return parsedChat{}, fmt.Errorf("invalid JSON body: %v", err)
	}
	if err := refuse(req, *s.refused.Load()); err != nil {
		return parsedChat{}, err
	}
	if len(req.Messages) == 0 {
		return parsedChat{}, invalid("messages", "messages must be a non-empty array")
	}
	p := parsedChat{model: cmp.Or(req.Model, s.cfg.Model), n: 1, stream: req.Stream, maxTokens: s.cfg.DefaultMaxTokens}
	if req.N != nil {
		if *req.N < 1 || *req.N > maxChoices {
			return parsedChat{}, invalid(openai.ParamN, "n must be between 1 and %d, got %d", maxChoices, *req.N)
		}
		p.n = *req.N
	}
	p.includeUsage = req.Stream && req.IncludeUsage()
	if req.Priority != nil {
		p.priority = *req.Priority
	}
	if limit := req.MaxOutputTokens(); limit != nil {
		p.maxTokens = *limit
	}
	if p.maxTokens < 1 {
		return parsedChat{}, invalid("max_tokens", "max_tokens must be at least 1, got %d", p.maxTokens)
	}
	var err error
	if p.msgs, err = readMessages(req.Messages); err != nil {
		return parsedChat{}, err
	}
	if p.gen, err = readGeneration(req); err != nil {
		return parsedChat{}, err
	}
	if p.prefix, err = readContinuation(req, p.msgs, p.n); err != nil {
		return parsedChat{}, err
	}
	p.gen.answerTokens = takeAnswerTokens(p.msgs)
	p.promptTokens = s.counter.CountChat(p.msgs)
	// A prompt that cannot fit one replica's whole KV cache (with room for
	// one output token) could never be scheduled; vLLM refuses it likewise.
	if limit := s.cfg.contextTokens(); p.promptTokens+1 > limit {
		// The message mirrors vLLM's and the code OpenAI's, which clients
		// may match on.
		return parsedChat{}, &requestError{param: "messages", code: "context_length_exceeded",
			msg: fmt.Sprintf("This model's maximum context length is %d tokens. However, your messages resulted in %d tokens.", limit, p.promptTokens)}
	}
	return p, nil
}

// readMessages checks the messages and reads them as text. A model reads
// an assistant's tool calls as text too, so they count in the prompt.
func readMessages(msgs []openai.Message) ([]tokens.Message, error) {
	out := make([]tokens.Message, 0, len(msgs))
	for i, m := range msgs {
		if err := validateMessage(i, m); err != nil {
			return nil, err
		}
		// Text skips parts that are not text rather than refuse them: the
		// simulator reads what it can.
		text, err := m.Text()
		if err != nil {
			return nil, invalid(fmt.Sprintf("messages[%d].content", i), "messages[%d].content: %v", i, err)
		}
		out = append(out, tokens.Message{Role: m.Role, Content: text})
	}
	return out, nil
}

// readGeneration checks the sampling parameters and reads what they ask
// of the answer. Temperature and top_p change nothing but the seed's
// part: answers stay deterministic whatever they are.
func readGeneration(req openai.ChatRequest) (generation, error) {
	sp := req.Sampling
	if err := validateSampling(sp); err != nil {
		return generation{}, err
	}
	format, schema, err := validateFormat(sp.ResponseFormat)
	if err != nil {
		return generation{}, err
	}
	mode, name, err := validateTools(sp)
	if err != nil {
		return generation{}, err
	}
	g := generation{stop: sp.Stop, format: format, schema: schema, tool: calledTool(sp.Tools, mode, name, req.Messages)}
	// Greedy decoding picks the likeliest token every time, so no seed
	// changes its answer.
	g.greedy = sp.Temperature != nil && *sp.Temperature == 0
	if !g.greedy {
		g.seed = sp.Seed
	}
	return g, nil
}

// readContinuation reads vLLM's continue_final_message: the text of the
// final message, an assistant's, that the answer continues. vLLM takes it
// only with add_generation_prompt false, which it otherwise defaults to
// true; the simulator continues one choice.
func readContinuation(req openai.ChatRequest, msgs []tokens.Message, n int) (*string, error) {
	if !req.ContinueFinalMessage {
		return nil, nil
	}
	if req.AddGenerationPrompt == nil || *req.AddGenerationPrompt {
		return nil, invalid("add_generation_prompt", "Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
	}
	last := msgs[len(msgs)-1]
	if last.Role != openai.RoleAssistant {
		return nil, invalid("continue_final_message", "continue_final_message needs the last message to be the assistant's, got %q", last.Role)
	}
	if n != 1 {
		return nil, invalid(openai.ParamN, "continue_final_message takes one choice here, got n=%d", n)
	}
	return &last.Content, nil
}
