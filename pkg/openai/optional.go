package openai

import "encoding/json"

// Optional is a field that can be left out, sent as null, or hold a value,
// three states a pointer cannot tell apart. OpenAI uses all three: a
// chunk's usage is absent unless asked for, then null until the last
// chunk. Fields of this type are tagged omitzero, which leaves them out
// until Null or Of sets them.
type Optional[T any] struct {
	// Present puts the field in the JSON; decoding sets it when the field
	// was there, null or not.
	Present bool
	// Value is the field's value; nil is sent as null.
	Value *T
}

// Null is a field sent as null.
func Null[T any]() Optional[T] { return Optional[T]{Present: true} }

// Of is a field sent with the value v.
func Of[T any](v T) Optional[T] { return Optional[T]{Present: true, Value: &v} }

// IsZero reports whether the field is left out; omitzero asks it.
func (o Optional[T]) IsZero() bool { return !o.Present }

// MarshalJSON encodes the value, or null.
func (o Optional[T]) MarshalJSON() ([]byte, error) { return json.Marshal(o.Value) }

// UnmarshalJSON decodes a field that was present, null or not.
func (o *Optional[T]) UnmarshalJSON(data []byte) error {
	o.Present, o.Value = true, nil
	return json.Unmarshal(data, &o.Value)
}
