package llmsim

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"

	"github.com/sluice-dev/sluice/pkg/openai"
)

// maxStops is how many stop sequences OpenAI takes.
const maxStops = 4

// maxChoices bounds n. OpenAI takes up to 128; the simulator takes few
// enough that a request's choices fit the default batch with room for
// other requests.
const maxChoices = 8

// requestError is a request the simulator refuses with 400. Param names
// the field at fault, as OpenAI's error does, so a client (or a gateway's
// test) can tell which one it was.
type requestError struct {
	param string
	// code is OpenAI's error code, when it has one for the refusal.
	code string
	msg  string
}

func (e *requestError) Error() string { return e.msg }

func invalid(param, format string, args ...any) error {
	return &requestError{param: param, msg: fmt.Sprintf(format, args...)}
}

// refuse names the first parameter the request sets that the simulated
// backend does not support, as a backend without one refuses it. A
// backend without several choices still takes n=1.
func refuse(req openai.ChatRequest, refused []string) error {
	set := req.Sampling.Set()
	if req.N != nil && *req.N != 1 {
		set = append(set, openai.ParamN)
	}
	for _, name := range set {
		if slices.Contains(refused, name) {
			return invalid(name, "%s is not supported by this model", name)
		}
	}
	return nil
}

// validateSampling checks the sampling parameters within OpenAI's bounds.
func validateSampling(sp openai.Sampling) error {
	checks := []error{
		inRange("temperature", sp.Temperature, 0, 2),
		validateTopP(sp.TopP),
		inRange("presence_penalty", sp.PresencePenalty, -2, 2),
		inRange("frequency_penalty", sp.FrequencyPenalty, -2, 2),
		validateLogitBias(sp.LogitBias),
	}
	if len(sp.Stop) > maxStops {
		checks = append(checks, invalid("stop", "stop takes at most %d sequences, got %d", maxStops, len(sp.Stop)))
	}
	for _, err := range checks {
		if err != nil {
			return err
		}
	}
	return nil
}

func inRange(param string, v *float64, lo, hi float64) error {
	if v != nil && (*v < lo || *v > hi) {
		return invalid(param, "%s must be between %g and %g, got %g", param, lo, hi, *v)
	}
	return nil
}

func validateTopP(v *float64) error {
	if v != nil && (*v <= 0 || *v > 1) {
		return invalid("top_p", "top_p must be greater than 0 and at most 1, got %g", *v)
	}
	return nil
}

// validateLogitBias checks that keys are token ids and biases within
// -100..100, in key order so that the error is the same every time.
func validateLogitBias(bias map[string]float64) error {
	keys := make([]string, 0, len(bias))
	for k := range bias {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if _, err := strconv.ParseUint(k, 10, 32); err != nil {
			return invalid("logit_bias", "logit_bias keys must be token ids (decimal integers), got %q", k)
		}
		if v := bias[k]; v < -100 || v > 100 {
			return invalid("logit_bias", "logit_bias[%s] must be between -100 and 100, got %g", k, v)
		}
	}
	return nil
}

// validateFormat checks response_format and returns json_schema's schema.
func validateFormat(rf *openai.ResponseFormat) (format string, schema json.RawMessage, err error) {
	if rf == nil {
		return openai.FormatText, nil, nil
	}
	switch rf.Type {
	case openai.FormatText, openai.FormatJSONObject:
		return rf.Type, nil, nil
	case openai.FormatJSONSchema:
	default:
		return "", nil, invalid("response_format.type", "response_format.type must be %s, %s or %s, got %q",
			openai.FormatText, openai.FormatJSONObject, openai.FormatJSONSchema, rf.Type)
	}
	var js struct {
		Name   string          `json:"name"`
		Schema json.RawMessage `json:"schema"`
	}
	if len(rf.JSONSchema) == 0 || json.Unmarshal(rf.JSONSchema, &js) != nil || string(rf.JSONSchema) == "null" {
		return "", nil, invalid("response_format.json_schema", "response_format json_schema needs a json_schema object")
	}
	if js.Name == "" {
		return "", nil, invalid("response_format.json_schema.name", "response_format.json_schema.name is required")
	}
	if _, _, err := readSchema(js.Schema); err != nil {
		return "", nil, invalid("response_format.json_schema.schema", "response_format.json_schema.schema: %v", err)
	}
	return rf.Type, js.Schema, nil
}

// validateTools checks the tools and tool_choice, and returns the choice's
// mode and the function it names.
func validateTools(sp openai.Sampling) (mode, name string, err error) {
	seen := map[string]bool{}
	for i, t := range sp.Tools {
		fn := t.Function
		switch {
		case t.Type != "function":
			return "", "", invalid(fmt.Sprintf("tools[%d].type", i), "tools[%d].type must be function, got %q", i, t.Type)
		case fn.Name == "":
			return "", "", invalid(fmt.Sprintf("tools[%d].function.name", i), "tools[%d].function.name is required", i)
		case seen[fn.Name]:
			return "", "", invalid(fmt.Sprintf("tools[%d].function.name", i), "tools[%d].function.name %q is not unique", i, fn.Name)
		}
		seen[fn.Name] = true
		if _, _, err := readSchema(fn.Parameters); err != nil {
			return "", "", invalid(fmt.Sprintf("tools[%d].function.parameters", i), "tools[%d].function.parameters: %v", i, err)
		}
	}
	mode, name, err = sp.DecodeToolChoice()
	switch {
	case err != nil:
		return "", "", invalid("tool_choice", "%v", err)
	case mode != openai.ToolChoiceNone && len(sp.Tools) == 0:
		return "", "", invalid("tool_choice", "tool_choice %q needs tools", mode)
	case mode == openai.ToolChoiceFunction && !seen[name]:
		return "", "", invalid("tool_choice", "tool_choice names function %q, which is not in tools", name)
	}
	return mode, name, nil
}

// validateMessage checks what a message of the given role must carry
// beyond its content.
func validateMessage(i int, m openai.Message) error {
	switch {
	case m.Role == "":
		return invalid(fmt.Sprintf("messages[%d].role", i), "messages[%d].role is required", i)
	case m.Role == openai.RoleTool && m.ToolCallID == "":
		return invalid(fmt.Sprintf("messages[%d].tool_call_id", i), "messages[%d] has role tool but no tool_call_id", i)
	}
	return nil
}
