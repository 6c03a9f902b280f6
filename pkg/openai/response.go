package openai

import "encoding/json"

// Header is what the completion, or every chunk of a stream, repeats: the
// same ID, Created and Model throughout one answer.
type Header struct {
	ID string `json:"id"`
	// Object is ObjectChatCompletion or ObjectChatCompletionChunk.
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	// ServiceTier is the service class the answer was served in
	// (default, flex, priority), whatever the request asked.
	ServiceTier string `json:"service_tier,omitempty"`
}

// Usage is the tokens one request used, as the server counted them.
type Usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// Completion is the answer to a request that did not ask to stream. A
// server that adds fields of its own embeds it.
type Completion struct {
	Header
	Choices []Choice `json:"choices"`
	Usage   Usage    `json:"usage"`
}

// Choice is one answer of a completion.
type Choice struct {
	Index   int              `json:"index"`
	Message AssistantMessage `json:"message"`
	// Logprobs is null at OpenAI unless asked for; a server that never
	// computes them may leave the field out. Sluice reads none, so it is
	// kept raw.
	Logprobs     Optional[json.RawMessage] `json:"logprobs,omitzero"`
	FinishReason string                    `json:"finish_reason"`
}

// AssistantMessage is the message a completion's choice answers with.
type AssistantMessage struct {
	Role string `json:"role"`
	// Content is null when the model only asked for tool calls.
	Content *string `json:"content"`
	// ToolCalls are the calls the model asks the client to make.
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
	// Refusal is null at OpenAI unless the model refused; a server without
	// refusals may leave the field out.
	Refusal Optional[string] `json:"refusal,omitzero"`
}

// Chunk is one event of a streamed answer. A server that adds fields of
// its own embeds it.
type Chunk struct {
	Header
	// Choices is empty on the usage chunk, which comes last.
	Choices []ChunkChoice `json:"choices"`
	// Usage is left out unless the client asked for it (IncludeUsage);
	// then it is null on every chunk but the last, which carries it.
	Usage Optional[Usage] `json:"usage,omitzero"`
}

// ChunkChoice is one choice's step in a chunk.
type ChunkChoice struct {
	Index int   `json:"index"`
	Delta Delta `json:"delta"`
	// Logprobs is as on Choice.
	Logprobs Optional[json.RawMessage] `json:"logprobs,omitzero"`
	// FinishReason is null until the choice's last chunk; clients tell the
	// end of an answer by it, so the null is always sent.
	FinishReason *string `json:"finish_reason"`
}

// Delta is what a chunk adds to its choice's message.
type Delta struct {
	// Role is sent once, on the choice's first chunk.
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
	// ToolCalls are pieces of the calls the model asks for: the first
	// piece of a call has its index, id, type and name, later ones add to
	// its arguments.
	ToolCalls []ToolCallDelta `json:"tool_calls,omitempty"`
}

// ToolCallDelta is one piece of a streamed tool call. Index tells the
// calls of one answer apart; the other fields are set on a call's first
// piece only, but for Arguments, which every piece extends.
type ToolCallDelta struct {
	Index    int               `json:"index"`
	ID       string            `json:"id,omitempty"`
	Type     string            `json:"type,omitempty"`
	Function FunctionCallDelta `json:"function"`
}

// FunctionCallDelta is a piece of a function call.
type FunctionCallDelta struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"`
}

// Finish reasons a choice ends with.
const (
	FinishStop          = "stop"
	FinishLength        = "length"
	FinishToolCalls     = "tool_calls"
	FinishContentFilter = "content_filter"
)

// AddToolCalls folds streamed pieces into the calls they build, in the
// order their indexes first appear.
func AddToolCalls(calls []ToolCall, index map[int]int, pieces []ToolCallDelta) []ToolCall {
	for _, p := range pieces {
		i, ok := index[p.Index]
		if !ok {
			i = len(calls)
			index[p.Index] = i
			calls = append(calls, ToolCall{Type: "function"})
		}
		c := &calls[i]
		if p.ID != "" {
			c.ID = p.ID
		}
		if p.Type != "" {
			c.Type = p.Type
		}
		if p.Function.Name != "" {
			c.Function.Name = p.Function.Name
		}
		c.Function.Arguments += p.Function.Arguments
	}
	return calls
}

// ErrorResponse is the body of an error response, and of the event that
// ends a stream which failed after it began.
type ErrorResponse struct {
	Error Error `json:"error"`
}

// Error says what went wrong. Param names the request field at fault
// (sent as null when none is); Code is left out when empty.
type Error struct {
	Message string           `json:"message"`
	Type    string           `json:"type"`
	Param   Optional[string] `json:"param,omitzero"`
	Code    Code             `json:"code,omitempty"`
}

// Code is an error's code. OpenAI sends a string; vLLM sends the HTTP
// status as a number, which is kept as its decimal text.
type Code string

// UnmarshalJSON accepts a string, a number or null.
func (c *Code) UnmarshalJSON(data []byte) error {
	if len(data) > 0 && data[0] == '"' {
		var s string
		if err := json.Unmarshal(data, &s); err != nil {
			return err
		}
		*c = Code(s)
		return nil
	}
	var n json.Number
	if err := json.Unmarshal(data, &n); err != nil {
		return err
	}
	*c = Code(n)
	return nil
}

// ModelList is the body of GET /v1/models.
type ModelList struct {
	// Object is ObjectList.
	Object string  `json:"object"`
	Data   []Model `json:"data"`
}

// Model describes one model a server serves.
type Model struct {
	ID string `json:"id"`
	// Object is ObjectModel.
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
	// MaxModelLen is vLLM's extension, which vLLM-compatible clients read:
	// the most tokens, prompt and answer together, one request may hold.
	// Zero, left out, where the server does not say.
	MaxModelLen int `json:"max_model_len,omitempty"`
}

// ObjectEmbedding is the "object" of one vector of an embeddings answer.
const ObjectEmbedding = "embedding"

// Encodings of an embedding on the wire.
const (
	EncodingFloat = "float"
	// EncodingBase64 is the vector's little-endian float32s in base64,
	// what the official JavaScript client asks for by default.
	EncodingBase64 = "base64"
)

// EmbeddingRequest is the body of POST /v1/embeddings.
type EmbeddingRequest struct {
	// Input is a string or an array of strings (token arrays are also
	// OpenAI's; a reader decides what it accepts).
	Input          json.RawMessage `json:"input"`
	Model          string          `json:"model"`
	EncodingFormat string          `json:"encoding_format,omitempty"`
	Dimensions     *int            `json:"dimensions,omitempty"`
	User           string          `json:"user,omitempty"`
}

// EmbeddingList is the answer to an embeddings request.
type EmbeddingList struct {
	// Object is ObjectList.
	Object string           `json:"object"`
	Data   []EmbeddingDatum `json:"data"`
	Model  string           `json:"model"`
	Usage  EmbeddingUsage   `json:"usage"`
}

// EmbeddingDatum is one input's vector.
type EmbeddingDatum struct {
	// Object is ObjectEmbedding.
	Object string `json:"object"`
	Index  int    `json:"index"`
	// Embedding is a []float32, or a base64 string (EncodingBase64).
	Embedding any `json:"embedding"`
}

// EmbeddingUsage counts an embeddings request's input tokens.
type EmbeddingUsage struct {
	PromptTokens int `json:"prompt_tokens"`
	TotalTokens  int `json:"total_tokens"`
}
