package openai

import "encoding/json"

// The Responses API (POST /v1/responses): the request, the Response
// object, and the events a streamed response is told in. Only what
// Sluice reads or writes is declared; a reader of a field not here gets
// it from the raw JSON.

// ObjectResponse is a Response's "object".
const ObjectResponse = "response"

// Response statuses.
const (
	ResponseQueued     = "queued"
	ResponseInProgress = "in_progress"
	ResponseCompleted  = "completed"
	ResponseIncomplete = "incomplete"
	ResponseFailed     = "failed"
	ResponseCancelled  = "cancelled"
)

// Response item and content types.
const (
	ItemMessage            = "message"
	ItemFunctionCall       = "function_call"
	ItemFunctionCallOutput = "function_call_output"
	PartInputText          = "input_text"
	PartInputImage         = "input_image"
	PartInputFile          = "input_file"
	PartOutputText         = "output_text"
	PartRefusal            = "refusal"
)

// ResponseRequest is the body of POST /v1/responses.
type ResponseRequest struct {
	Model string `json:"model"`
	// Input is a string (one user message) or an array of input items.
	Input        json.RawMessage `json:"input"`
	Instructions *string         `json:"instructions,omitempty"`
	// MaxOutputTokens caps the answer.
	MaxOutputTokens   *int              `json:"max_output_tokens,omitempty"`
	Temperature       *float64          `json:"temperature,omitempty"`
	TopP              *float64          `json:"top_p,omitempty"`
	Tools             []ResponseTool    `json:"tools,omitempty"`
	ToolChoice        json.RawMessage   `json:"tool_choice,omitempty"`
	ParallelToolCalls *bool             `json:"parallel_tool_calls,omitempty"`
	Text              *ResponseText     `json:"text,omitempty"`
	Metadata          map[string]string `json:"metadata,omitempty"`
	Stream            bool              `json:"stream,omitempty"`
	ServiceTier       string            `json:"service_tier,omitempty"`
	// Store keeps the response to be read back and continued (absent:
	// stored, as at OpenAI, where the server stores responses).
	Store *bool `json:"store,omitempty"`
	// PreviousResponseID continues a stored response's conversation.
	PreviousResponseID string `json:"previous_response_id,omitempty"`
	// Background runs the response with no client waiting: the create
	// answers at once (queued), and the response is read, streamed again
	// or cancelled by its id.
	Background bool `json:"background,omitempty"`
}

// ResponseTool is a function the model may call: the Responses API
// declares it flat, where chat completions nest it under "function".
type ResponseTool struct {
	Type        string          `json:"type"`
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
	Strict      *bool           `json:"strict,omitempty"`
}

// ResponseText configures the answer's text: its format.
type ResponseText struct {
	Format *ResponseTextFormat `json:"format,omitempty"`
}

// ResponseTextFormat is text, json_object, or json_schema with its name
// and schema inline (chat completions nest them under json_schema).
type ResponseTextFormat struct {
	Type        string          `json:"type"`
	Name        string          `json:"name,omitempty"`
	Description string          `json:"description,omitempty"`
	Schema      json.RawMessage `json:"schema,omitempty"`
	Strict      *bool           `json:"strict,omitempty"`
}

// Response is the Responses API's answer object, whole or as it stands.
// Fields OpenAI sends as null when unset are pointers without omitempty,
// for clients that read every field.
type Response struct {
	ID                string             `json:"id"`
	Object            string             `json:"object"`
	CreatedAt         int64              `json:"created_at"`
	Status            string             `json:"status"`
	CompletedAt       *int64             `json:"completed_at"`
	Error             *ResponseError     `json:"error"`
	IncompleteDetails *IncompleteDetails `json:"incomplete_details"`
	Instructions      *string            `json:"instructions"`
	MaxOutputTokens   *int               `json:"max_output_tokens"`
	Model             string             `json:"model"`
	// Output holds ResponseMessage and ResponseFunctionCall items.
	Output             []any             `json:"output"`
	ParallelToolCalls  bool              `json:"parallel_tool_calls"`
	PreviousResponseID *string           `json:"previous_response_id"`
	Temperature        *float64          `json:"temperature"`
	TopP               *float64          `json:"top_p"`
	ToolChoice         json.RawMessage   `json:"tool_choice"`
	Tools              []ResponseTool    `json:"tools"`
	Text               ResponseText      `json:"text"`
	Truncation         string            `json:"truncation"`
	Background         bool              `json:"background"`
	Store              bool              `json:"store"`
	ServiceTier        string            `json:"service_tier,omitempty"`
	Metadata           map[string]string `json:"metadata"`
	Usage              *ResponseUsage    `json:"usage"`
}

// ResponseMessage is an output message item.
type ResponseMessage struct {
	Type   string `json:"type"`
	ID     string `json:"id"`
	Status string `json:"status"`
	Role   string `json:"role"`
	// Content is never null: a client appends the parts it is told of.
	Content []OutputText `json:"content"`
}

// OutputText is a message's text part.
type OutputText struct {
	Type        string `json:"type"`
	Text        string `json:"text"`
	Annotations []any  `json:"annotations"`
	Logprobs    []any  `json:"logprobs"`
}

// ResponseFunctionCall is an output item that asks the client to call a
// function, and the input item that says it did.
type ResponseFunctionCall struct {
	Type      string `json:"type"`
	ID        string `json:"id,omitempty"`
	CallID    string `json:"call_id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
	Status    string `json:"status,omitempty"`
}

// ResponseUsage counts a response's tokens.
type ResponseUsage struct {
	InputTokens         int                 `json:"input_tokens"`
	InputTokensDetails  InputTokensDetails  `json:"input_tokens_details"`
	OutputTokens        int                 `json:"output_tokens"`
	OutputTokensDetails OutputTokensDetails `json:"output_tokens_details"`
	TotalTokens         int                 `json:"total_tokens"`
}

// InputTokensDetails: Sluice reports no prompt-cache hits.
type InputTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// OutputTokensDetails: Sluice's backends report no reasoning tokens.
type OutputTokensDetails struct {
	ReasoningTokens int `json:"reasoning_tokens"`
}

// ResponseError is why a response failed.
type ResponseError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// IncompleteDetails says why a response ended before its answer did.
type IncompleteDetails struct {
	// Reason is max_output_tokens or content_filter.
	Reason string `json:"reason"`
}

// ResponseEvent is one event of a streamed response. Which fields it
// carries depends on its Type; those that may be 0 or "" and must still
// be sent are pointers.
type ResponseEvent struct {
	Type           string    `json:"type"`
	SequenceNumber int       `json:"sequence_number"`
	Response       *Response `json:"response,omitempty"`
	OutputIndex    *int      `json:"output_index,omitempty"`
	ContentIndex   *int      `json:"content_index,omitempty"`
	ItemID         string    `json:"item_id,omitempty"`
	// Item is a ResponseMessage or a ResponseFunctionCall.
	Item      any         `json:"item,omitempty"`
	Part      *OutputText `json:"part,omitempty"`
	Delta     *string     `json:"delta,omitempty"`
	Text      *string     `json:"text,omitempty"`
	Arguments *string     `json:"arguments,omitempty"`
	Name      string      `json:"name,omitempty"`
	Logprobs  *[]any      `json:"logprobs,omitempty"`
}

// Response event types, as a stream tells them.
const (
	EventResponseCreated       = "response.created"
	EventResponseQueued        = "response.queued"
	EventResponseInProgress    = "response.in_progress"
	EventResponseCompleted     = "response.completed"
	EventResponseIncomplete    = "response.incomplete"
	EventResponseFailed        = "response.failed"
	EventOutputItemAdded       = "response.output_item.added"
	EventOutputItemDone        = "response.output_item.done"
	EventContentPartAdded      = "response.content_part.added"
	EventContentPartDone       = "response.content_part.done"
	EventOutputTextDelta       = "response.output_text.delta"
	EventOutputTextDone        = "response.output_text.done"
	EventFunctionArgumentDelta = "response.function_call_arguments.delta"
	EventFunctionArgumentDone  = "response.function_call_arguments.done"
)
