package codec

import (
	"bytes"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	commonpb "go.temporal.io/api/common/v1"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// Test keys, not secrets.
var (
	oldKey = Key{ID: "2025-01", Secret: []byte("sluice-test-codec-key-1-NOTSECRT")}
	newKey = Key{ID: "2025-02", Secret: []byte("sluice-test-codec-key-2-NOTSECRT")}
)

func ring(t *testing.T, active string, keys ...Key) *Keyring {
	t.Helper()
	k, err := NewKeyring(active, keys...)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

type chatInput struct {
	Query  string
	Tenant string
}

const secretQuery = "what is the launch code of project bluebird?"

func TestSealedPayloadHidesItsContentAndNamesItsKey(t *testing.T) {
	dc := ring(t, oldKey.ID, oldKey).DataConverter()
	p, err := dc.ToPayload(chatInput{Query: secretQuery, Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(p.Data, []byte("bluebird")) || bytes.Contains(p.Data, []byte("acme")) {
		t.Fatal("the sealed payload carries the plaintext")
	}
	if got := string(p.Metadata["encoding"]); got != Encoding {
		t.Fatalf("encoding %q", got)
	}
	if got := string(p.Metadata[MetadataKeyID]); got != oldKey.ID {
		t.Fatalf("key id %q", got)
	}
	if len(p.Metadata) != 2 {
		t.Fatalf("metadata %v: the inner payload's (its json/plain type) must be sealed too", p.Metadata)
	}
	var back chatInput
	if err := dc.FromPayload(p, &back); err != nil || back.Query != secretQuery {
		t.Fatalf("round trip: %+v %v", back, err)
	}
	// A fresh nonce each time: the same input never seals alike.
	q, _ := dc.ToPayload(chatInput{Query: secretQuery, Tenant: "acme"})
	if bytes.Equal(p.Data, q.Data) {
		t.Fatal("two seals of one input are equal: the nonce is reused")
	}
}

// Rotation: a history sealed with the old key is read after the new one
// becomes active, as long as the old one is still listed.
func TestRotation(t *testing.T) {
	before := ring(t, oldKey.ID, oldKey).DataConverter()
	old, _ := before.ToPayload(chatInput{Query: secretQuery})

	after := ring(t, newKey.ID, oldKey, newKey).DataConverter()
	fresh, _ := after.ToPayload(chatInput{Query: secretQuery})
	if string(fresh.Metadata[MetadataKeyID]) != newKey.ID {
		t.Fatalf("sealed with %s after the rotation", fresh.Metadata[MetadataKeyID])
	}
	for _, p := range []*commonpb.Payload{old, fresh} {
		var got chatInput
		if err := after.FromPayload(p, &got); err != nil || got.Query != secretQuery {
			t.Fatalf("open %s: %+v %v", p.Metadata[MetadataKeyID], got, err)
		}
	}
	dropped := ring(t, newKey.ID, newKey).DataConverter()
	var got chatInput
	if err := dropped.FromPayload(old, &got); err == nil || !strings.Contains(err.Error(), `key "2025-01"`) {
		t.Fatalf("old payload without its key: %v", err)
	}
}

func TestTamperingIsDetected(t *testing.T) {
	k := ring(t, oldKey.ID, oldKey, newKey)
	sealed, _ := k.Encode([]*commonpb.Payload{{Metadata: map[string][]byte{"encoding": []byte("json/plain")}, Data: []byte(`"hi"`)}})
	flipped := &commonpb.Payload{Metadata: sealed[0].Metadata, Data: bytes.Clone(sealed[0].Data)}
	flipped.Data[len(flipped.Data)-1] ^= 1
	if _, err := k.Decode([]*commonpb.Payload{flipped}); err == nil {
		t.Fatal("a flipped bit decrypted")
	}
	// Relabelled with the other key's id: the id is authenticated.
	relabelled := &commonpb.Payload{Metadata: map[string][]byte{"encoding": []byte(Encoding), MetadataKeyID: []byte(newKey.ID)}, Data: sealed[0].Data}
	if _, err := k.Decode([]*commonpb.Payload{relabelled}); err == nil {
		t.Fatal("a payload relabelled with another key's id decrypted")
	}
	if _, err := k.Decode([]*commonpb.Payload{{Metadata: sealed[0].Metadata, Data: []byte("short")}}); err == nil {
		t.Fatal("a truncated payload decrypted")
	}
}

// Histories written before the codec was on hold plain payloads; they
// still read.
func TestPlainPayloadsPassThrough(t *testing.T) {
	plain, _ := converter.GetDefaultDataConverter().ToPayload(chatInput{Query: "hi"})
	var got chatInput
	if err := ring(t, oldKey.ID, oldKey).DataConverter().FromPayload(plain, &got); err != nil || got.Query != "hi" {
		t.Fatalf("%+v %v", got, err)
	}
}

// Failure messages may quote the prompt: they are sealed too, and come
// back whole, with their type.
func TestFailureMessagesAreSealed(t *testing.T) {
	fc := ring(t, oldKey.ID, oldKey).FailureConverter()
	f := fc.ErrorToFailure(temporal.NewApplicationError("backend refused: "+secretQuery, "LLMRefused"))
	if strings.Contains(f.String(), "bluebird") {
		t.Fatalf("failure carries the plaintext: %v", f)
	}
	err := fc.FailureToError(f)
	var app *temporal.ApplicationError
	if !errors.As(err, &app) || app.Type() != "LLMRefused" || !strings.Contains(app.Error(), "bluebird") {
		t.Fatalf("round trip: %v", err)
	}
}

func TestNewKeyringRefusesBadKeys(t *testing.T) {
	for name, c := range map[string]struct {
		active string
		keys   []Key
	}{
		"short":      {"a", []Key{{ID: "a", Secret: []byte("16-bytes-is-less")}}},
		"no id":      {"", []Key{{Secret: oldKey.Secret}}},
		"duplicate":  {"a", []Key{{ID: "a", Secret: oldKey.Secret}, {ID: "a", Secret: newKey.Secret}}},
		"not listed": {"b", []Key{{ID: "a", Secret: oldKey.Secret}}},
	} {
		if _, err := NewKeyring(c.active, c.keys...); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// The codec server protocol, as the Temporal UI and CLI call it.
func TestHandlerDecodesAndEncodes(t *testing.T) {
	k := ring(t, oldKey.ID, oldKey)
	sealed, _ := k.DataConverter().ToPayload(secretQuery)
	h := Handler(k, 1<<20)
	body, _ := protojson.Marshal(&commonpb.Payloads{Payloads: []*commonpb.Payload{sealed}})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/codec/decode", bytes.NewReader(body)))
	if rec.Code != 200 {
		t.Fatalf("decode: %d %s", rec.Code, rec.Body)
	}
	var out commonpb.Payloads
	if err := protojson.Unmarshal(rec.Body.Bytes(), &out); err != nil || len(out.Payloads) != 1 || !strings.Contains(string(out.Payloads[0].Data), "bluebird") {
		t.Fatalf("decoded %v %v", &out, err)
	}

	body, _ = protojson.Marshal(&out)
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/codec/encode", bytes.NewReader(body)))
	if rec.Code != 200 || strings.Contains(rec.Body.String(), "bluebird") || !strings.Contains(rec.Body.String(), "encryption-key-id") {
		t.Fatalf("encode: %d %s", rec.Code, rec.Body)
	}

	rec = httptest.NewRecorder()
	Handler(k, 10).ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/codec/decode", bytes.NewReader(body)))
	if rec.Code != http.StatusRequestEntityTooLarge {
		t.Fatalf("oversized body: %d", rec.Code)
	}
}

// A chat's workflow input is about 1.5 KB of JSON (tests/histories);
// its answer a few KB.
func BenchmarkSealAndOpen(b *testing.B) {
	for _, size := range []int{1 << 10, 16 << 10} {
		b.Run(map[int]string{1 << 10: "1KiB", 16 << 10: "16KiB"}[size], func(b *testing.B) {
			k, err := NewKeyring(oldKey.ID, oldKey)
			if err != nil {
				b.Fatal(err)
			}
			p := []*commonpb.Payload{{Metadata: map[string][]byte{"encoding": []byte("json/plain")}, Data: bytes.Repeat([]byte("a"), size)}}
			b.SetBytes(int64(size))
			b.ReportAllocs()
			for b.Loop() {
				sealed, err := k.Encode(p)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := k.Decode(sealed); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// The growth of a sealed payload over its plaintext: nonce, tag, the
// inner payload's metadata and the two metadata entries.
func TestSealedSizeOverhead(t *testing.T) {
	k := ring(t, oldKey.ID, oldKey)
	p := &commonpb.Payload{Metadata: map[string][]byte{"encoding": []byte("json/plain")}, Data: bytes.Repeat([]byte("a"), 1500)}
	sealed, _ := k.Encode([]*commonpb.Payload{p})
	grew := proto.Size(sealed[0]) - proto.Size(p)
	t.Logf("a 1500-byte payload grows by %d bytes when sealed", grew)
	if grew <= 28 || grew > 120 {
		t.Fatalf("grew by %d bytes", grew)
	}
}
