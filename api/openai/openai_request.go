package openai

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/sluice-dev/sluice/door"
	"github.com/sluice-dev/sluice/pkg/openai"
	"github.com/sluice-dev/sluice/pkg/refusal"
)

// completionRequest is OpenAI's chat completion request with Sluice's
// extension.
type completionRequest struct {
	openai.ChatRequest
	// KB is Sluice's extension: the knowledge base to answer from.
	KB string `json:"kb"`
	// ServiceTier asks for a service class: auto (the plan's default),
	// default, flex or priority. It is Sluice's to decide, never the
	// backend's: a pool may pass the class on as a priority.
	ServiceTier string `json:"service_tier,omitempty"`
}

// acceptedFields are the request fields Sluice reads or forwards. A field
// outside them, or in defaultOnly at another value, is refused: a client
// asking for logprobs or audio must hear that it gets none, not receive
// an answer that looks as if it did.
var acceptedFields = append([]string{
	"model", "messages", "max_tokens", "max_completion_tokens", "n", "stream", "stream_options", "kb", door.ParamServiceTier,
	// user is OpenAI's end-user id for abuse reports; Sluice knows the
	// user by the API key, so it is read as a label and not forwarded.
	"user",
}, openai.SamplingParams...)

// defaultOnly are fields accepted only at the value that asks for nothing.
var defaultOnly = map[string]string{"logprobs": "false", "store": "false"}

// maxChoices bounds OpenAI's n: each choice is a sequence the backend
// decodes beside the others under the request's one permit, so n is a
// multiplier on what a permit costs.
const maxChoices = 8

// parseCompletionRequest reads an OpenAI chat completion request into the
// chat request it asks for. kb is the X-Sluice-KB header. It checks what
// can be checked without the configuration; Server.checkConversation does
// the rest.
func parseCompletionRequest(body []byte, kb string) (completionRequest, door.Request, error) {
	var cr completionRequest
	if err := json.Unmarshal(body, &cr); err != nil {
		return cr, door.Request{}, refusal.BadRequest("bad_json", "malformed JSON: %v", err)
	}
	if err := refuseUnsupported(body); err != nil {
		return cr, door.Request{}, err
	}
	if cr.N != nil && (*cr.N < 1 || *cr.N > maxChoices) {
		return cr, door.Request{}, paramError("n", "invalid_value", "n must be between 1 and %d", maxChoices)
	}
	if err := checkSampling(cr.Sampling); err != nil {
		return cr, door.Request{}, err
	}
	req := door.Request{MaxTokens: cr.MaxOutputTokens(), Conversation: cr.Messages, Choices: 1, ServiceTier: cr.ServiceTier}
	if cr.N != nil {
		req.Choices = *cr.N
	}
	rag, err := resolveModel(cr.Model, cr.KB, kb, &req)
	if err != nil {
		return cr, door.Request{}, err
	}
	if len(cr.Sampling.Set()) > 0 {
		req.Sampling = &cr.Sampling
	}
	query, err := checkMessages(cr.Messages, &req)
	if err != nil {
		return cr, door.Request{}, err
	}
	if rag {
		if query == "" {
			return cr, door.Request{}, paramError("messages", "no_user_message",
				"messages must include a user message with text: it is what the knowledge base is searched for")
		}
		req.Query = query
	}
	return cr, req, nil
}

// resolveModel sets req's model, knowledge base and mode from what the
// client named: model is a backend's model (gateway mode, or RAG mode
// when a kb is named too), sluice-rag (the default kb) or
// sluice-rag/<kb>; kb is the body's, else header's (X-Sluice-KB). It
// reports whether the request answers from a knowledge base.
func resolveModel(model, kb, header string, req *door.Request) (rag bool, err error) {
	req.KB = cmp.Or(kb, header)
	switch alias, named := strings.CutPrefix(model, door.RAGModel+"/"); {
	case model == door.RAGModel:
		rag = true
	case named:
		if req.KB != "" && req.KB != alias {
			return false, paramError("model", "kb_conflict",
				"model %q names knowledge base %q but the request also names %q", model, alias, req.KB)
		}
		req.KB, rag = alias, true
	default:
		req.Model = model
		rag = req.KB != ""
	}
	req.Gateway = !rag
	if req.Gateway && model == "" {
		return false, paramError("model", "missing_model",
			"model is required: a backend model (GET /v1/models lists them), or %q to answer from a knowledge base", door.RAGModel)
	}
	return rag, nil
}

// refuseUnsupported refuses a field outside acceptedFields, naming it.
func refuseUnsupported(body []byte) error {
	return refuseOutside(body, acceptedFields, defaultOnly)
}

// refuseOutside refuses a field outside accepted, or in only at another
// value than the one given, naming it.
func refuseOutside(body []byte, accepted []string, only map[string]string) error {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil {
		return refusal.BadRequest("bad_json", "the body must be a JSON object: %v", err)
	}
	names := make([]string, 0, len(fields))
	for name := range fields {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		v := string(bytes.TrimSpace(fields[name]))
		if slices.Contains(accepted, name) || v == "null" || only[name] == v {
			continue
		}
		return paramError(name, "unsupported_parameter", "%s is not supported by Sluice", name)
	}
	return nil
}

// checkSampling checks the forwarded parameters against OpenAI's ranges,
// so that a request the model would refuse is refused before it waits in
// a queue, naming the field.
func checkSampling(p openai.Sampling) error {
	inRange := func(name string, v *float64, lo, hi float64) error {
		if v != nil && (*v < lo || *v > hi) {
			return paramError(name, "invalid_value", "%s must be between %g and %g, got %g", name, lo, hi, *v)
		}
		return nil
	}
	for _, err := range []error{
		inRange("temperature", p.Temperature, 0, 2), inRange("top_p", p.TopP, 0, 1),
		inRange("presence_penalty", p.PresencePenalty, -2, 2), inRange("frequency_penalty", p.FrequencyPenalty, -2, 2),
	} {
		if err != nil {
			return err
		}
	}
	if len(p.Stop) > 4 {
		return paramError("stop", "invalid_value", "stop holds at most 4 sequences, got %d", len(p.Stop))
	}
	for tok, bias := range p.LogitBias {
		if bias < -100 || bias > 100 {
			return paramError("logit_bias", "invalid_value", "logit_bias[%s] must be between -100 and 100", tok)
		}
	}
	if f := p.ResponseFormat; f != nil && !slices.Contains([]string{openai.FormatText, openai.FormatJSONObject, openai.FormatJSONSchema}, f.Type) {
		return paramError("response_format.type", "invalid_value", "response_format.type must be text, json_object or json_schema")
	}
	return checkTools(p)
}

// checkTools checks the tools and that tool_choice names one of them.
func checkTools(p openai.Sampling) error {
	names := map[string]bool{}
	for i, t := range p.Tools {
		if t.Type != "function" || t.Function.Name == "" {
			return paramError(fmt.Sprintf("tools[%d]", i), "invalid_value", `tools[%d] must be {"type":"function","function":{"name":...}}`, i)
		}
		if names[t.Function.Name] {
			return paramError(fmt.Sprintf("tools[%d].function.name", i), "invalid_value", "tool %q is declared twice", t.Function.Name)
		}
		names[t.Function.Name] = true
	}
	mode, name, err := p.DecodeToolChoice()
	switch {
	case err != nil:
		return paramError("tool_choice", "invalid_value", "%v", err)
	case mode != openai.ToolChoiceNone && len(p.Tools) == 0:
		return paramError("tool_choice", "invalid_value", "tool_choice %q needs tools", mode)
	case mode == openai.ToolChoiceFunction && !names[name]:
		return paramError("tool_choice", "invalid_value", "tool_choice names %q, which is not among the tools", name)
	}
	return nil
}

// checkMessages checks each message's role and content, notes the kinds
// of content the conversation holds in req, and returns the text of the
// last user message.
func checkMessages(msgs []openai.Message, req *door.Request) (string, error) {
	if len(msgs) == 0 {
		return "", paramError("messages", "no_messages", "messages must hold at least one message")
	}
	query := ""
	for i, m := range msgs {
		at := fmt.Sprintf("messages[%d]", i)
		parts, err := m.Parts()
		if err != nil {
			return "", paramError(at+".content", "bad_content", "%s.content must be a string, an array of content parts or null", at)
		}
		text, err := noteParts(req, parts, at+".content")
		if err != nil {
			return "", err
		}
		if err := checkMessage(m, at, len(parts) > 0); err != nil {
			return "", err
		}
		if m.Role == openai.RoleUser && strings.TrimSpace(text) != "" {
			query = text
		}
	}
	return query, nil
}

// checkMessage checks a message's role and what that role must carry.
func checkMessage(m openai.Message, at string, hasContent bool) error {
	switch m.Role {
	case openai.RoleSystem, openai.RoleDeveloper, openai.RoleUser:
		if !hasContent {
			return paramError(at+".content", "empty_content", "%s has no content", at)
		}
	case openai.RoleAssistant:
		if !hasContent && len(m.ToolCalls) == 0 {
			return paramError(at+".content", "empty_content", "%s has neither content nor tool_calls", at)
		}
	case openai.RoleTool:
		if m.ToolCallID == "" {
			return paramError(at+".tool_call_id", "missing_tool_call_id", "%s is a tool result: it needs the tool_call_id it answers", at)
		}
	default:
		return paramError(at+".role", "bad_role", "unknown role %q; expected system, developer, user, assistant or tool", m.Role)
	}
	return nil
}

// noteParts checks a message's content parts and counts what is not text;
// it returns the text parts joined by newlines.
func noteParts(req *door.Request, parts []openai.ContentPart, at string) (string, error) {
	texts := make([]string, 0, len(parts))
	for i, p := range parts {
		switch {
		case p.Type == openai.ContentPartText && p.Text != nil:
			texts = append(texts, *p.Text)
		case p.Type == openai.ContentPartText:
			return "", paramError(fmt.Sprintf("%s[%d].text", at, i), "bad_content", "a text part needs its text")
		case slices.Contains(openai.ContentPartTypes, p.Type):
			req.MediaParts++
			req.MediaTokens += door.MediaTokens(p)
			if !slices.Contains(req.PartTypes, p.Type) {
				req.PartTypes = append(req.PartTypes, p.Type)
			}
		default:
			return "", paramError(fmt.Sprintf("%s[%d].type", at, i), "unsupported_content",
				"content part of type %q is unknown; expected one of %s", p.Type, strings.Join(openai.ContentPartTypes, ", "))
		}
	}
	return strings.Join(texts, "\n"), nil
}
