package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
)

// Roles of a conversation's messages.
const (
	RoleSystem    = "system"
	RoleDeveloper = "developer"
	RoleUser      = "user"
	RoleAssistant = "assistant"
	RoleTool      = "tool"
)

// Message is one message of a conversation. A decoded message keeps the
// JSON it came from and encodes to it again, so that a gateway forwards
// a client's message whole (fields it does not declare, such as an
// audio reference or a backend's extension, included) while it reads
// the fields below to check and count it.
type Message struct {
	Role string `json:"role"`
	// Content is a JSON string, an array of content parts, or null. It is
	// kept as sent so that a malformed content is the reader's error about
	// one message, with its index, not a failure to decode the request;
	// Parts decodes it.
	Content json.RawMessage `json:"content"`
	// Name tells participants of the same role apart.
	Name string `json:"name,omitempty"`
	// ToolCalls are the calls an assistant message asked for.
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
	// ToolCallID is the call a tool message answers.
	ToolCallID string `json:"tool_call_id,omitempty"`

	// raw is the JSON the message was decoded from; nil for a message
	// built here.
	raw json.RawMessage
}

// message is Message without its methods, for the default encoding.
type message Message

// UnmarshalJSON decodes the fields and keeps the JSON.
func (m *Message) UnmarshalJSON(data []byte) error {
	var fields message
	if err := json.Unmarshal(data, &fields); err != nil {
		return err
	}
	*m = Message(fields)
	m.raw = append(json.RawMessage(nil), data...)
	return nil
}

// MarshalJSON is the JSON the message was decoded from, or its fields.
func (m Message) MarshalJSON() ([]byte, error) {
	if m.raw != nil {
		return m.raw, nil
	}
	return json.Marshal(message(m))
}

// ToolCall is one function call an assistant message asks for.
type ToolCall struct {
	ID string `json:"id"`
	// Type is "function".
	Type     string       `json:"type"`
	Function FunctionCall `json:"function"`
}

// FunctionCall names the function to call and its arguments, a JSON object
// as text (the model writes it; nothing guarantees it parses).
type FunctionCall struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// ContentPartTypes are the kinds of content part OpenAI defines.
var ContentPartTypes = []string{ContentPartText, ContentPartImage, "input_audio", "file"}

// ContentPartImage is an image part's type.
const ContentPartImage = "image_url"

// ContentPart is one part of a message's content.
type ContentPart struct {
	Type string `json:"type"`
	// Text is set on text parts; nil tells a part without text from an
	// empty one.
	Text *string `json:"text,omitempty"`
	// ImageURL is set on image parts.
	ImageURL *ImageURL `json:"image_url,omitempty"`
}

// ImageURL is where an image part's image is (a URL, or a data: URL
// holding it) and the detail the model is to see it at (low, high or
// auto; "" is auto).
type ImageURL struct {
	URL    string `json:"url"`
	Detail string `json:"detail,omitempty"`
}

// UnmarshalJSON reads an image_url object, or a bare URL string as some
// clients send it, so that a part the door only estimates is never
// refused for its shape; anything else reads as an unknown image.
func (u *ImageURL) UnmarshalJSON(raw []byte) error {
	var url string
	if json.Unmarshal(raw, &url) == nil {
		*u = ImageURL{URL: url}
		return nil
	}
	type plain ImageURL
	var p plain
	if json.Unmarshal(raw, &p) == nil {
		*u = ImageURL(p)
	}
	return nil
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

// Text is what a model reads of the message as text: its text parts, then
// the calls it asks for (name and arguments), joined by newlines. Parts
// of other kinds (images, audio) are not text and are left out; a reader
// that must account for them does so itself.
func (m Message) Text() (string, error) {
	parts, err := m.Parts()
	if err != nil {
		return "", err
	}
	texts := make([]string, 0, len(parts)+len(m.ToolCalls))
	for _, p := range parts {
		if p.Type == ContentPartText && p.Text != nil {
			texts = append(texts, *p.Text)
		}
	}
	for _, c := range m.ToolCalls {
		texts = append(texts, c.Function.Name+c.Function.Arguments)
	}
	return strings.Join(texts, "\n"), nil
}
