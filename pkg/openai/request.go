// Package openai declares the wire types of OpenAI's Chat Completions API
// as Sluice speaks it: the gateway's front door reads requests and writes
// completions and chunks, the backend client writes requests and reads
// chunks, and the simulator does the reverse. Each type is declared here
// once, so a field the API gains (a sampling parameter, tool calls, more
// choices) is added in one place and every side can read or write it.
//
// The types describe the JSON only. What a side accepts (which roles,
// which content parts, how many choices) stays with that side: the
// gateway and the simulator are deliberately different servers.
package openai

// Object names the kind of a response object, in its "object" field.
const (
	ObjectChatCompletion      = "chat.completion"
	ObjectChatCompletionChunk = "chat.completion.chunk"
	ObjectList                = "list"
	ObjectModel               = "model"
)

// ContentPartText is the type of a content part that carries text.
const ContentPartText = "text"

// ChatRequest is the body of POST /v1/chat/completions. Fields it does not
// declare are ignored when decoding; a server that must refuse what it
// cannot honour asks UnknownFields. Optional numbers are pointers so that
// a reader can tell "absent" from zero.
type ChatRequest struct {
	Model    string    `json:"model"`
	Messages []Message `json:"messages"`
	// MaxTokens is the older name of MaxCompletionTokens; clients send
	// either, and MaxOutputTokens decides between them.
	MaxTokens           *int `json:"max_tokens,omitempty"`
	MaxCompletionTokens *int `json:"max_completion_tokens,omitempty"`
	// N is the number of choices asked for.
	N             *int           `json:"n,omitempty"`
	Stream        bool           `json:"stream"`
	StreamOptions *StreamOptions `json:"stream_options,omitempty"`
	// Sampling is what a gateway forwards to the model as it came.
	Sampling
	// ContinueFinalMessage and AddGenerationPrompt are vLLM's chat
	// template switches: with continue_final_message true and
	// add_generation_prompt false the model continues the last message,
	// an assistant's, instead of answering after it. Sluice's backend
	// client sends them to fail a stream over mid-answer; its front door
	// does not take them from clients.
	ContinueFinalMessage bool  `json:"continue_final_message,omitempty"`
	AddGenerationPrompt  *bool `json:"add_generation_prompt,omitempty"`
	// Priority is vLLM's (with --scheduling-policy priority): lower is
	// scheduled sooner, 0 is its default. Sluice's backend client sends
	// it to a pool that says its backend takes it; its front door does
	// not take it from clients (service_tier asks for a class instead).
	Priority *int `json:"priority,omitempty"`
}

// StreamOptions tunes a streamed answer.
type StreamOptions struct {
	// IncludeUsage asks for a last chunk that carries the usage, and for
	// "usage": null on every chunk before it.
	IncludeUsage bool `json:"include_usage"`
}

// IncludeUsage reports whether the client asked for the usage chunk.
func (r ChatRequest) IncludeUsage() bool {
	return r.StreamOptions != nil && r.StreamOptions.IncludeUsage
}

// MaxOutputTokens is the cap on the answer's length, nil when the request
// sets none. max_completion_tokens wins over max_tokens, as it does at
// OpenAI, which deprecated the older name.
func (r ChatRequest) MaxOutputTokens() *int {
	if r.MaxCompletionTokens != nil {
		return r.MaxCompletionTokens
	}
	return r.MaxTokens
}
