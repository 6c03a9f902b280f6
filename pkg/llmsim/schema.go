package llmsim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
)

// property is one top-level property of an object's JSON Schema, as much
// of it as the simulator reads to write a value that fits.
type property struct {
	name string
	// typ is the property's JSON type: "" when the schema names none, the
	// first that is not "null" when it names several.
	typ string
	// enum is the first value the property may take, compact JSON; nil
	// when the schema lists none.
	enum json.RawMessage
}

// readSchema reads an object schema's top-level properties, in the order
// they are written, and its required list. An absent or null schema has
// neither.
func readSchema(raw json.RawMessage) ([]property, []string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil, nil
	}
	if raw[0] != '{' {
		return nil, nil, errors.New("must be a JSON Schema object")
	}
	var top struct {
		Properties json.RawMessage `json:"properties"`
		Required   []string        `json:"required"`
	}
	if err := json.Unmarshal(raw, &top); err != nil {
		return nil, nil, fmt.Errorf("read schema: %w", err)
	}
	props, err := readProperties(top.Properties)
	if err != nil {
		return nil, nil, fmt.Errorf("read schema properties: %w", err)
	}
	return props, top.Required, nil
}

// readProperties reads "properties" key by key: the order the schema
// lists them in is the order a model writes them, which a map would lose.
func readProperties(raw json.RawMessage) ([]property, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, errors.New("properties must be an object")
	}
	var props []property
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		name, _ := tok.(string)
		var def json.RawMessage
		if err := dec.Decode(&def); err != nil {
			return nil, fmt.Errorf("property %q: %w", name, err)
		}
		p, err := readProperty(name, def)
		if err != nil {
			return nil, err
		}
		props = append(props, p)
	}
	return props, nil
}

// readProperty reads a property's type and first enum value. A schema
// that is not an object (true, false) says nothing of either.
func readProperty(name string, raw json.RawMessage) (property, error) {
	p := property{name: name}
	if len(raw) == 0 || raw[0] != '{' {
		return p, nil
	}
	var def struct {
		Type json.RawMessage   `json:"type"`
		Enum []json.RawMessage `json:"enum"`
	}
	if err := json.Unmarshal(raw, &def); err != nil {
		return p, fmt.Errorf("property %q: %w", name, err)
	}
	p.typ = schemaType(def.Type)
	if len(def.Enum) > 0 {
		var b bytes.Buffer
		if err := json.Compact(&b, def.Enum[0]); err != nil {
			return p, fmt.Errorf("property %q enum: %w", name, err)
		}
		p.enum = b.Bytes()
	}
	return p, nil
}

// schemaType reads "type", a name or a list of names.
func schemaType(raw json.RawMessage) string {
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return one
	}
	var many []string
	_ = json.Unmarshal(raw, &many)
	for _, t := range many {
		if t != "null" {
			return t
		}
	}
	return ""
}

// isString reports whether the property takes words: a string, or a
// property whose schema allows anything.
func (p property) isString() bool {
	return p.enum == nil && (p.typ == "string" || p.typ == "")
}

// sample is a value of the property's type for an answer in JSON, but
// for strings, which are the answer's words; i tells properties apart so
// that their numbers differ.
func (p property) sample(ans answer, i int) string {
	if v, ok := p.fixed(); ok {
		return v
	}
	r := ans.draw(saltNumber, i)
	switch p.typ {
	case "integer":
		return strconv.FormatUint(r%100, 10)
	case "number":
		return strconv.FormatFloat(float64(r%10000)/100, 'f', -1, 64)
	}
	return "null"
}

// argument is a value of the property's type for a tool call's
// arguments: a word of the question for a string, 1 for a number.
func (p property) argument(ans answer, i int) string {
	if v, ok := p.fixed(); ok {
		return v
	}
	switch p.typ {
	case "string", "":
		return quote(ans.echo(i))
	case "integer", "number":
		return "1"
	}
	return "null"
}

// fixed is the value a property takes whatever the answer: its first enum
// value, or the simplest value of a boolean, array or object.
func (p property) fixed() (string, bool) {
	if p.enum != nil {
		return string(p.enum), true
	}
	switch p.typ {
	case "boolean":
		return "true", true
	case "array":
		return "[]", true
	case "object":
		return "{}", true
	}
	return "", false
}
