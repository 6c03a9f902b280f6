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

import (
	"bytes"
	"encoding/json"
	"errors"
)

// Object names the kind of a response object, in its "object" field.
const (
	ObjectChatCompletion      = "chat.completion"
	ObjectChatCompletionChunk = "chat.completion.chunk"
	ObjectList                = "list"
	ObjectModel               = "model"
)

// ContentPartText is the type of a content part that carries text.
const ContentPartText = "text"

// ChatRequest is the body of POST /v1/chat/completions. Fields a reader
// does not declare here (temperature, user, ...) are ignored when decoding,
// which is what lets unchanged OpenAI clients talk to Sluice. Optional
// numbers are pointers so that a reader can tell "absent" from zero.
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

// Message is one message of a conversation.
type Message struct {
	Role string `json:"role"`
	// Content is a JSON string, an array of content parts, or null. It is
	// kept as sent so that a malformed content is the reader's error about
	// one message, with its index, not a failure to decode the request;
	// Parts decodes it.
	Content json.RawMessage `json:"content"`
}

// ContentPart is one part of a message's content.
type ContentPart struct {
	Type string `json:"type"`
	// Text is set on text parts; nil tells a part without text from an
	// empty one.
	Text *string `json:"text,omitempty"`
}

// errContentShape is the one way content can be malformed once the request
// it is in has decoded.
var errContentShape = errors.New("content must be a string or an array of content parts")

// TextMessage is a message whose content is a plain string, the form every
// OpenAI-compatible server accepts.
func TextMessage(role, text string) Message {
	// Marshalling a string cannot fail.
	raw, _ := json.Marshal(text)
	return Message{Role: role, Content: raw}
}

// Parts decodes the message's content. A string is one text part; null or
// no content is no parts. Which parts count is the reader's choice: the
// gateway refuses a part it cannot read, the simulator skips it.
func (m Message) Parts() ([]ContentPart, error) {
	raw := bytes.TrimSpace(m.Content)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, err
		}
		return []ContentPart{{Type: ContentPartText, Text: &s}}, nil
	}
	var parts []ContentPart
	if err := json.Unmarshal(raw, &parts); err != nil {
		return nil, errContentShape
	}
	return parts, nil
}
