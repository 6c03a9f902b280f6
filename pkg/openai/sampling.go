package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Sampling is the part of a chat request that tells the model how to
// generate: a gateway forwards it unchanged, a model server honours it.
// Every field is left out when not set, so that a backend's own defaults
// stay in force.
type Sampling struct {
	Temperature      *float64 `json:"temperature,omitempty"`
	TopP             *float64 `json:"top_p,omitempty"`
	Stop             Stop     `json:"stop,omitempty"`
	Seed             *int64   `json:"seed,omitempty"`
	PresencePenalty  *float64 `json:"presence_penalty,omitempty"`
	FrequencyPenalty *float64 `json:"frequency_penalty,omitempty"`
	// LogitBias maps token ids (as strings) to a bias from -100 to 100.
	LogitBias      map[string]float64 `json:"logit_bias,omitempty"`
	ResponseFormat *ResponseFormat    `json:"response_format,omitempty"`
	Tools          []Tool             `json:"tools,omitempty"`
	// ToolChoice is "none", "auto", "required" or a named function;
	// ToolChoice.Decode reads it.
	ToolChoice        json.RawMessage `json:"tool_choice,omitempty"`
	ParallelToolCalls *bool           `json:"parallel_tool_calls,omitempty"`
}

// SamplingParams names Sampling's fields as they are sent, in order: what
// a server that refuses some of them (a backend without logit_bias) may
// list.
var SamplingParams = []string{
	"temperature", "top_p", "stop", "seed", "presence_penalty", "frequency_penalty",
	"logit_bias", "response_format", "tools", "tool_choice", "parallel_tool_calls",
}

// ParamN is OpenAI's n, the number of answers: not a sampling parameter,
// but one a backend may not support.
const ParamN = "n"

// ValidateUnsupported checks a name a backend may be said not to support
// (a pool's unsupported list): n, a sampling parameter or a content part
// type, the three things a request asks of a backend that the backend
// may lack.
func ValidateUnsupported(name string) error {
	if name == ParamN || slices.Contains(SamplingParams, name) || slices.Contains(ContentPartTypes, name) {
		return nil
	}
	return fmt.Errorf("%q is neither %s, a forwarded parameter (%s) nor a content part type (%s)",
		name, ParamN, strings.Join(SamplingParams, ", "), strings.Join(ContentPartTypes, ", "))
}

// Set lists the parameters s sets, in SamplingParams' order.
func (s Sampling) Set() []string {
	set := []bool{
		s.Temperature != nil, s.TopP != nil, len(s.Stop) > 0, s.Seed != nil, s.PresencePenalty != nil,
		s.FrequencyPenalty != nil, len(s.LogitBias) > 0, s.ResponseFormat != nil, len(s.Tools) > 0,
		!isNull(s.ToolChoice), s.ParallelToolCalls != nil,
	}
	var names []string
	for i, ok := range set {
		if ok {
			names = append(names, SamplingParams[i])
		}
	}
	return names
}

// isNull reports a raw field that is absent or null.
func isNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || bytes.Equal(raw, []byte("null"))
}

// Stop is up to four sequences that end the answer where the model would
// write them. OpenAI accepts one string or an array; it is sent as an
// array.
type Stop []string

// UnmarshalJSON accepts a string, an array of strings or null.
func (s *Stop) UnmarshalJSON(data []byte) error {
	data = bytes.TrimSpace(data)
	switch {
	case bytes.Equal(data, []byte("null")):
		*s = nil
		return nil
	case len(data) > 0 && data[0] == '"':
		var one string
		if err := json.Unmarshal(data, &one); err != nil {
			return err
		}
		*s = Stop{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(data, &many); err != nil {
		return errors.New("stop must be a string or an array of strings")
	}
	*s = many
	return nil
}

// Response formats.
const (
	FormatText       = "text"
	FormatJSONObject = "json_object"
	FormatJSONSchema = "json_schema"
)

// ResponseFormat asks for plain text, any JSON object, or JSON that
// matches a schema.
type ResponseFormat struct {
	Type string `json:"type"`
	// JSONSchema is {"name", "schema", "strict"} for json_schema.
	JSONSchema json.RawMessage `json:"json_schema,omitempty"`
}

// Tool is a function the model may ask the client to call.
type Tool struct {
	// Type is "function".
	Type     string      `json:"type"`
	Function FunctionDef `json:"function"`
}

// FunctionDef describes a function: its parameters are a JSON Schema
// object.
type FunctionDef struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
	Strict      *bool           `json:"strict,omitempty"`
}

// Tool choice modes.
const (
	ToolChoiceNone     = "none"
	ToolChoiceAuto     = "auto"
	ToolChoiceRequired = "required"
	// ToolChoiceFunction: call the function Decode names.
	ToolChoiceFunction = "function"
)

// DecodeToolChoice reads a tool_choice: its mode and, for a named
// function, the name. Absent is "auto" when there are tools, as at
// OpenAI, and "none" otherwise.
func (s Sampling) DecodeToolChoice() (mode, name string, err error) {
	raw := bytes.TrimSpace(s.ToolChoice)
	if isNull(raw) {
		if len(s.Tools) > 0 {
			return ToolChoiceAuto, "", nil
		}
		return ToolChoiceNone, "", nil
	}
	if raw[0] == '"' {
		if err := json.Unmarshal(raw, &mode); err != nil {
			return "", "", err
		}
		switch mode {
		case ToolChoiceNone, ToolChoiceAuto, ToolChoiceRequired:
			return mode, "", nil
		}
		return "", "", fmt.Errorf("tool_choice %q is not none, auto or required", mode)
	}
	var named struct {
		Type     string `json:"type"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if err := json.Unmarshal(raw, &named); err != nil || named.Type != "function" || named.Function.Name == "" {
		return "", "", errors.New(`tool_choice must be "none", "auto", "required" or {"type":"function","function":{"name":...}}`)
	}
	return ToolChoiceFunction, named.Function.Name, nil
}
