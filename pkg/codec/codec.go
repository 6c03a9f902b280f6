// Package codec encrypts the payloads Sluice hands Temporal, so that the
// Temporal server, its database and its backups hold ciphertext: a user's
// question, the retrieved passages and the answer never reach them in
// the clear. It is a Temporal PayloadCodec: the client's data converter
// runs it on every payload it sends (workflow and activity inputs and
// results, signals, queries, updates, memos, encoded failure messages)
// and on every payload it receives. Search attributes are not payloads of
// the codec (the server indexes them) and stay readable.
package codec

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"fmt"

	commonpb "go.temporal.io/api/common/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"
	"google.golang.org/protobuf/proto"
)

const (
	// Encoding is the metadata "encoding" of a sealed payload; the
	// Temporal UI and CLI show it for payloads they cannot decode.
	Encoding = "binary/encrypted"
	// MetadataKeyID names the key that sealed a payload, so that it is
	// found again after a rotation.
	MetadataKeyID    = "encryption-key-id"
	metadataEncoding = converter.MetadataEncoding
	// KeySize is the length of an AES-256 key.
	KeySize = 32
)

// Key is one AES-256 key and its id.
type Key struct {
	ID     string
	Secret []byte
}

// Keyring seals with its active key and opens with any of its keys. It is
// a converter.PayloadCodec, safe for concurrent use.
type Keyring struct {
	active string
	aeads  map[string]cipher.AEAD
}

// NewKeyring returns a keyring that seals with the key named active.
func NewKeyring(active string, keys ...Key) (*Keyring, error) {
	k := &Keyring{active: active, aeads: make(map[string]cipher.AEAD, len(keys))}
	for _, key := range keys {
		if key.ID == "" {
			return nil, errors.New("codec: a key without an id")
		}
		if _, dup := k.aeads[key.ID]; dup {
			return nil, fmt.Errorf("codec: key id %q twice", key.ID)
		}
		if len(key.Secret) != KeySize {
			return nil, fmt.Errorf("codec: key %q is %d bytes, want %d (AES-256)", key.ID, len(key.Secret), KeySize)
		}
		block, err := aes.NewCipher(key.Secret)
		if err != nil {
			return nil, fmt.Errorf("codec: key %q: %w", key.ID, err)
		}
		if k.aeads[key.ID], err = cipher.NewGCM(block); err != nil {
			return nil, fmt.Errorf("codec: key %q: %w", key.ID, err)
		}
	}
	if _, ok := k.aeads[active]; !ok {
		return nil, fmt.Errorf("codec: the active key %q is not among the keys", active)
	}
	return k, nil
}

// Options say whether payloads are sealed, and with which keys.
type Options struct {
	// Enabled seals payloads; off, New returns no keyring (whose Apply
	// leaves a client as it is).
	Enabled bool
	// ActiveKey names the key that seals; every key opens.
	ActiveKey string
	Keys      []Key
}

// New is the keyring o describes; nil when the codec is off.
func New(o Options) (*Keyring, error) {
	if !o.Enabled {
		return nil, nil
	}
	return NewKeyring(o.ActiveKey, o.Keys...)
}

// Encode seals each payload whole (its metadata too, which names its
// type) with the active key and a fresh random nonce. The key id is also
// the additional data, so that a payload relabelled with another key's id
// fails to open rather than open under the wrong name.
func (k *Keyring) Encode(payloads []*commonpb.Payload) ([]*commonpb.Payload, error) {
	aead := k.aeads[k.active]
	out := make([]*commonpb.Payload, len(payloads))
	for i, p := range payloads {
		plain, err := proto.Marshal(p)
		if err != nil {
			return nil, fmt.Errorf("encrypt payload: marshal it: %w", err)
		}
		nonce := make([]byte, aead.NonceSize(), aead.NonceSize()+len(plain)+aead.Overhead())
		if _, err := rand.Read(nonce); err != nil {
			return nil, fmt.Errorf("encrypt payload: draw a nonce: %w", err)
		}
		out[i] = &commonpb.Payload{
			Metadata: map[string][]byte{metadataEncoding: []byte(Encoding), MetadataKeyID: []byte(k.active)},
			Data:     aead.Seal(nonce, nonce, plain, []byte(k.active)),
		}
	}
	return out, nil
}

// Decode opens each sealed payload with the key it names. A payload that
// is not sealed passes as it is: histories written before the codec was
// turned on stay readable.
func (k *Keyring) Decode(payloads []*commonpb.Payload) ([]*commonpb.Payload, error) {
	out := make([]*commonpb.Payload, len(payloads))
	for i, p := range payloads {
		if string(p.GetMetadata()[metadataEncoding]) != Encoding {
			out[i] = p
			continue
		}
		id := string(p.GetMetadata()[MetadataKeyID])
		aead, ok := k.aeads[id]
		if !ok {
			return nil, fmt.Errorf("decrypt payload: it was sealed with key %q, which codec.keys does not list (removed before its histories aged out?)", id)
		}
		data := p.GetData()
		if len(data) < aead.NonceSize() {
			return nil, fmt.Errorf("decrypt payload sealed with key %q: %d bytes, too short", id, len(data))
		}
		plain, err := aead.Open(nil, data[:aead.NonceSize()], data[aead.NonceSize():], []byte(id))
		if err != nil {
			return nil, fmt.Errorf("decrypt payload sealed with key %q: %w", id, err)
		}
		inner := &commonpb.Payload{}
		if err := proto.Unmarshal(plain, inner); err != nil {
			return nil, fmt.Errorf("decrypt payload sealed with key %q: unmarshal it: %w", id, err)
		}
		out[i] = inner
	}
	return out, nil
}

// DataConverter is the default converter with k on top.
func (k *Keyring) DataConverter() converter.DataConverter {
	return converter.NewCodecDataConverter(converter.GetDefaultDataConverter(), k)
}

// FailureConverter turns errors into failures whose message and stack
// trace are a payload of the data converter, so they are sealed too (by
// default Temporal keeps them in the clear: an activity's error may quote
// the prompt). Errors keep their type, which workflows branch on.
func (k *Keyring) FailureConverter() converter.FailureConverter {
	return temporal.NewDefaultFailureConverter(temporal.DefaultFailureConverterOptions{
		DataConverter: k.DataConverter(), EncodeCommonAttributes: true,
	})
}

// Apply makes a client seal what it sends and open what it reads; every
// worker built on the client inherits it. A nil keyring leaves o alone.
func (k *Keyring) Apply(o *client.Options) {
	if k == nil {
		return
	}
	o.DataConverter, o.FailureConverter = k.DataConverter(), k.FailureConverter()
}

// ApplyReplayer makes a replayer read histories this keyring sealed.
func (k *Keyring) ApplyReplayer(o *worker.WorkflowReplayerOptions) {
	if k == nil {
		return
	}
	o.DataConverter, o.FailureConverter = k.DataConverter(), k.FailureConverter()
}
