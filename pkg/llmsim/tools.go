package llmsim

import (
	"fmt"
	"slices"
	"strings"

	"github.com/sluice-dev/sluice/pkg/openai"
)

// calledTool is the function the answer calls, or nil when it answers in
// text. A request with tools calls one unless tool_choice is "none" or
// the conversation ends with a tool's result, which the model then
// answers in text: the function tool_choice names, or else the first.
// Deciding is deterministic, so "auto" always calls.
func calledTool(tools []openai.Tool, mode, name string, msgs []openai.Message) *openai.FunctionDef {
	if mode == openai.ToolChoiceNone || len(tools) == 0 || msgs[len(msgs)-1].Role == openai.RoleTool {
		return nil
	}
	for i := range tools {
		if name == "" || tools[i].Function.Name == name {
			return &tools[i].Function
		}
	}
	return nil
}

// toolCall is the call an answer makes to fn, and its tokens. The call's
// id is the server's, not the model's, so it differs between choices
// even when greedy decoding gives them the same arguments. Its id, type
// and name are the first token, which adds no arguments; the
// arguments, a JSON object made from fn's parameters, follow in the
// pieces a model writes them in. Every token is a step of the engine, so
// a call costs batch time and KV blocks like text of its length.
func toolCall(ans answer, fn openai.FunctionDef) (openai.ToolCall, tokenList) {
	call := openai.ToolCall{
		ID:       fmt.Sprintf("call_%016x", mix(ans.hash^0xca11^uint64(ans.choice)<<32)),
		Type:     "function",
		Function: openai.FunctionCall{Name: fn.Name},
	}
	// The parameters were read once on arrival, so they read again.
	props, required, _ := readSchema(fn.Parameters)
	return call, append(tokenList{""}, splitRuns(arguments(ans, argumentProps(props, required)))...)
}

// argumentProps is what a call fills in: the required properties, or all
// of them when none is required. A required name the properties do not
// describe takes a string.
func argumentProps(props []property, required []string) []property {
	if len(required) == 0 {
		return props
	}
	var out []property
	for _, p := range props {
		if slices.Contains(required, p.name) {
			out = append(out, p)
		}
	}
	for _, name := range required {
		if !slices.ContainsFunc(out, func(p property) bool { return p.name == name }) {
			out = append(out, property{name: name, typ: "string"})
		}
	}
	return out
}

// arguments writes the call's arguments as compact JSON, as OpenAI's
// models do.
func arguments(ans answer, props []property) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, p := range props {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(quote(p.name))
		b.WriteByte(':')
		b.WriteString(p.argument(ans, i))
	}
	b.WriteByte('}')
	return b.String()
}

// echo is a word of the question for the i-th string argument, or
// "sluice" when the question has none worth repeating.
func (a answer) echo(i int) string {
	if len(a.echoes) == 0 {
		return "sluice"
	}
	return a.echoes[a.draw(saltEcho, i)%uint64(len(a.echoes))]
}
