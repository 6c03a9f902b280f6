package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/sluice-dev/sluice/door"
	"github.com/sluice-dev/sluice/pkg/openai"
	"github.com/sluice-dev/sluice/pkg/refusal"
)

// responseRequest is the Responses API's request with Sluice's extension.
type responseRequest struct {
	openai.ResponseRequest
	// KB is Sluice's extension: the knowledge base to answer from.
	KB string `json:"kb"`
}

// responseFields are the Responses request fields Sluice reads or
// forwards; any other is refused, naming it.
var responseFields = []string{
	"model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "tools", "tool_choice",
	"parallel_tool_calls", "text", "metadata", "stream", "kb", door.ParamServiceTier, "store", "previous_response_id", "background",
	// Labels OpenAI reads for abuse reports and its prompt cache; Sluice
	// knows the user by the API key and forwards none of them.
	"user", "safety_identifier", "prompt_cache_key",
}

// responseDefaultOnly are fields accepted only at the value that asks for
// nothing more: the conversation is never truncated to fit.
var responseDefaultOnly = map[string]string{"truncation": `"disabled"`}

// Metadata bounds, as OpenAI's.
const (
	maxMetadataPairs = 16
	maxMetadataKey   = 64
	maxMetadataValue = 512
)

// parseResponseRequest reads a Responses request that continues no
// stored response into the chat request it asks for (decode, then
// chatRequest). kb is the X-Sluice-KB header.
func parseResponseRequest(body []byte, kb string) (responseRequest, door.Request, error) {
	rr, err := decodeResponseRequest(body)
	if err != nil {
		return rr, door.Request{}, err
	}
	req, err := rr.chatRequest(kb, nil)
	return rr, req, err
}

// decodeResponseRequest reads a Responses request's body, refusing a
// field Sluice does not read.
func decodeResponseRequest(body []byte) (responseRequest, error) {
	var rr responseRequest
	if err := json.Unmarshal(body, &rr); err != nil {
		return rr, refusal.BadRequest("bad_json", "malformed JSON: %v", err)
	}
	if err := refuseOutside(body, responseFields, responseDefaultOnly); err != nil {
		return rr, err
	}
	return rr, checkMetadata(rr.Metadata)
}

// chatRequest is the chat request rr asks for: prior items (the stored
// conversation it continues) then its input items become the
// conversation, instructions a leading system message, and the tools
// and text format those of chat completions, so that it takes the same
// door and workflow. kb is the X-Sluice-KB header.
func (rr responseRequest) chatRequest(kb string, prior []json.RawMessage) (door.Request, error) {
	own, err := inputItems(rr.Input)
	if err != nil {
		return door.Request{}, err
	}
	msgs, err := itemMessages(append(prior[:len(prior):len(prior)], own...), len(prior))
	if err != nil {
		return door.Request{}, err
	}
	if rr.Instructions != nil && *rr.Instructions != "" {
		msgs = append([]openai.Message{openai.TextMessage(openai.RoleSystem, *rr.Instructions)}, msgs...)
	}
	sampling, err := responseSampling(rr.ResponseRequest)
	if err != nil {
		return door.Request{}, err
	}
	if err := checkSampling(sampling); err != nil {
		return door.Request{}, err
	}
	req := door.Request{MaxTokens: rr.MaxOutputTokens, Conversation: msgs, Choices: 1, ServiceTier: rr.ServiceTier, Background: rr.Background}
	rag, err := resolveModel(rr.Model, rr.KB, kb, &req)
	if err != nil {
		return door.Request{}, err
	}
	if len(sampling.Set()) > 0 {
		req.Sampling = &sampling
	}
	query, err := checkMessages(msgs, &req)
	if err != nil {
		return door.Request{}, err
	}
	if rag {
		if query == "" {
			return door.Request{}, paramError("input", "no_user_message",
				"input must include a user message with text: it is what the knowledge base is searched for")
		}
		req.Query = query
	}
	return req, nil
}

func checkMetadata(m map[string]string) error {
	if len(m) > maxMetadataPairs {
		return paramError("metadata", "invalid_value", "metadata holds at most %d pairs, got %d", maxMetadataPairs, len(m))
	}
	for k, v := range m {
		if len(k) > maxMetadataKey || len(v) > maxMetadataValue {
			return paramError("metadata", "invalid_value", "metadata keys are at most %d characters and values %d (key %q)",
				maxMetadataKey, maxMetadataValue, k)
		}
	}
	return nil
}

// inputItem is one item of a Responses input, as much of it as any kind
// has.
type inputItem struct {
	Type    string          `json:"type"`
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
	// A function call and its output.
	CallID    string          `json:"call_id"`
	Name      string          `json:"name"`
	Arguments string          `json:"arguments"`
	Output    json.RawMessage `json:"output"`
}

// inputItems is a Responses input as its items: a string is one user
// message.
func inputItems(raw json.RawMessage) ([]json.RawMessage, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, paramError("input", "missing_input", "input is required: a string or an array of input items")
	}
	if raw[0] == '"' {
		var text string
		if err := json.Unmarshal(raw, &text); err != nil || text == "" {
			return nil, paramError("input", "empty_input", "input is an empty string")
		}
		item, err := json.Marshal(map[string]any{"type": openai.ItemMessage, "role": openai.RoleUser,
			"content": []map[string]string{{"type": openai.PartInputText, "text": text}}})
		if err != nil {
			return nil, fmt.Errorf("encode input: %w", err)
		}
		return []json.RawMessage{item}, nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, paramError("input", "bad_input", "input must be a string or an array of input items")
	}
	if len(items) == 0 {
		return nil, paramError("input", "empty_input", "input holds no items")
	}
	return items, nil
}

// itemMessages is input items as chat messages: each message item a
// message, consecutive function calls one assistant message that asks
// for them, and each function call output a tool message. The items
// from own on are the request's own, which errors name (input[i]).
func itemMessages(raws []json.RawMessage, own int) ([]openai.Message, error) {
	var msgs []openai.Message
	for k, raw := range raws {
		at := fmt.Sprintf("input[%d]", k-own)
		if k < own {
			at = fmt.Sprintf("previous_response_id (item %d)", k)
		}
		var it inputItem
		if err := json.Unmarshal(raw, &it); err != nil {
			return nil, paramError(at, "bad_input", "%s must be an input item object", at)
		}
		switch {
		case it.Type == openai.ItemFunctionCall:
			if it.CallID == "" || it.Name == "" {
				return nil, paramError(at, "invalid_value", "%s is a function call: it needs call_id and name", at)
			}
			call := openai.ToolCall{ID: it.CallID, Type: "function", Function: openai.FunctionCall{Name: it.Name, Arguments: it.Arguments}}
			if n := len(msgs); n > 0 && msgs[n-1].Role == openai.RoleAssistant && len(msgs[n-1].ToolCalls) > 0 {
				msgs[n-1].ToolCalls = append(msgs[n-1].ToolCalls, call)
				continue
			}
			msgs = append(msgs, openai.Message{Role: openai.RoleAssistant, Content: json.RawMessage("null"), ToolCalls: []openai.ToolCall{call}})
		case it.Type == openai.ItemFunctionCallOutput:
			m, err := callOutput(it, at)
			if err != nil {
				return nil, err
			}
			msgs = append(msgs, m)
		case it.Type == openai.ItemMessage || it.Type == "" && it.Role != "":
			m, err := itemMessage(it, at)
			if err != nil {
				return nil, err
			}
			msgs = append(msgs, m)
		default:
			return nil, paramError(at+".type", "unsupported_value",
				"input item of type %q is not supported; Sluice reads message, function_call and function_call_output items", it.Type)
		}
	}
	return msgs, nil
}

// callOutput is a function call's output as a tool message.
func callOutput(it inputItem, at string) (openai.Message, error) {
	if it.CallID == "" {
		return openai.Message{}, paramError(at+".call_id", "missing_tool_call_id", "%s is a function call output: it needs the call_id it answers", at)
	}
	var text string
	if err := json.Unmarshal(it.Output, &text); err != nil {
		return openai.Message{}, paramError(at+".output", "invalid_value", "%s.output must be a string", at)
	}
	m := openai.TextMessage(openai.RoleTool, text)
	m.ToolCallID = it.CallID
	return m, nil
}

// itemMessage is a message item as a chat message: a string content as
// it is, parts as chat content parts.
func itemMessage(it inputItem, at string) (openai.Message, error) {
	if !slices.Contains([]string{openai.RoleUser, openai.RoleSystem, openai.RoleDeveloper, openai.RoleAssistant}, it.Role) {
		return openai.Message{}, paramError(at+".role", "bad_role", "%s.role must be user, system, developer or assistant, got %q", at, it.Role)
	}
	content := bytes.TrimSpace(it.Content)
	if len(content) > 0 && content[0] == '"' {
		return openai.Message{Role: it.Role, Content: content}, nil
	}
	var parts []json.RawMessage
	if err := json.Unmarshal(content, &parts); err != nil || len(parts) == 0 {
		return openai.Message{}, paramError(at+".content", "bad_content", "%s.content must be a string or a non-empty array of content parts", at)
	}
	out := make([]any, 0, len(parts))
	for j, raw := range parts {
		p, err := chatPart(raw, fmt.Sprintf("%s.content[%d]", at, j))
		if err != nil {
			return openai.Message{}, err
		}
		out = append(out, p)
	}
	encoded, err := json.Marshal(out)
	if err != nil {
		return openai.Message{}, fmt.Errorf("encode %s: %w", at, err)
	}
	return openai.Message{Role: it.Role, Content: encoded}, nil
}

// chatPart is a Responses content part as a chat completions one.
func chatPart(raw json.RawMessage, at string) (any, error) {
	var p struct {
		Type     string `json:"type"`
		Text     string `json:"text"`
		ImageURL string `json:"image_url"`
		Detail   string `json:"detail"`
		FileID   string `json:"file_id"`
		FileData string `json:"file_data"`
		Filename string `json:"filename"`
	}
	if err := json.Unmarshal(raw, &p); err != nil {
		return nil, paramError(at, "bad_content", "%s must be a content part object", at)
	}
	switch p.Type {
	case openai.PartInputText, openai.PartOutputText, openai.PartRefusal:
		return map[string]string{"type": openai.ContentPartText, "text": p.Text}, nil
	case openai.PartInputImage:
		if p.ImageURL == "" {
			return nil, paramError(at+".image_url", "unsupported_value", "%s: Sluice reads images by image_url (a URL or a data: URL), not file_id", at)
		}
		return openai.ContentPart{Type: openai.ContentPartImage, ImageURL: &openai.ImageURL{URL: p.ImageURL, Detail: p.Detail}}, nil
	case openai.PartInputFile:
		if p.FileData == "" {
			return nil, paramError(at+".file_data", "unsupported_value", "%s: Sluice reads files by file_data, not file_id or file_url", at)
		}
		return map[string]any{"type": "file", "file": map[string]string{"file_data": p.FileData, "filename": p.Filename}}, nil
	}
	return nil, paramError(at+".type", "unsupported_content", "content part of type %q is unknown; expected input_text, input_image or input_file", p.Type)
}

// responseSampling is a Responses request's sampling as chat completions
// name it: tools nest under function, a named tool_choice too, and the
// text format becomes response_format.
func responseSampling(r openai.ResponseRequest) (openai.Sampling, error) {
	s := openai.Sampling{Temperature: r.Temperature, TopP: r.TopP, ParallelToolCalls: r.ParallelToolCalls}
	for i, t := range r.Tools {
		if t.Type != "function" {
			return s, paramError(fmt.Sprintf("tools[%d].type", i), "unsupported_value",
				"tools[%d] is of type %q; Sluice passes function tools only", i, t.Type)
		}
		if t.Name == "" {
			return s, paramError(fmt.Sprintf("tools[%d].name", i), "invalid_value", "tools[%d] needs a name", i)
		}
		s.Tools = append(s.Tools, openai.Tool{Type: "function", Function: openai.FunctionDef{
			Name: t.Name, Description: t.Description, Parameters: t.Parameters, Strict: t.Strict}})
	}
	choice, err := chatToolChoice(r.ToolChoice)
	if err != nil {
		return s, err
	}
	s.ToolChoice = choice
	if r.Text != nil && r.Text.Format != nil {
		f := r.Text.Format
		s.ResponseFormat = &openai.ResponseFormat{Type: f.Type}
		if f.Type == openai.FormatJSONSchema {
			schema, err := json.Marshal(map[string]any{"name": f.Name, "description": f.Description, "schema": f.Schema, "strict": f.Strict})
			if err != nil {
				return s, paramError("text.format.schema", "invalid_value", "text.format.schema must be a JSON object")
			}
			s.ResponseFormat.JSONSchema = schema
		}
	}
	return s, nil
}

// chatToolChoice is a Responses tool_choice as chat completions name it:
// {"type":"function","name":N} becomes {"type":"function","function":{"name":N}}.
func chatToolChoice(raw json.RawMessage) (json.RawMessage, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '{' {
		return raw, nil
	}
	var named struct {
		Type string `json:"type"`
		Name string `json:"name"`
	}
	if err := json.Unmarshal(raw, &named); err != nil || named.Type != "function" || named.Name == "" {
		return nil, paramError("tool_choice", "invalid_value", `tool_choice must be "none", "auto", "required" or {"type":"function","name":...}`)
	}
	out, err := json.Marshal(map[string]any{"type": "function", "function": map[string]string{"name": named.Name}})
	if err != nil {
		return nil, fmt.Errorf("encode tool_choice: %w", err)
	}
	return out, nil
}
