package testenv

import (
	"github.com/sluice-dev/sluice/pkg/codec"
	"github.com/sluice-dev/sluice/pkg/config"
)

// CodecTestKey sealed the encrypted histories under tests/histories/encrypted.
// It is a TEST KEY, published with the source: never use it for real data.
var CodecTestKey = codec.Key{ID: "sluice-test-key", Secret: []byte("sluice-test-codec-key-NOT-SECRET")}

// CodecTestConfig is codec: on with CodecTestKey, as a stack under test
// sets it.
func CodecTestConfig() config.Codec {
	return config.Codec{Enabled: true, ActiveKey: CodecTestKey.ID,
		Keys: []config.CodecKey{{ID: CodecTestKey.ID, Secret: CodecTestKey.Secret}}}
}

// CodecTestKeyring opens what CodecTestConfig sealed.
func CodecTestKeyring() (*codec.Keyring, error) {
	return codec.NewKeyring(CodecTestKey.ID, CodecTestKey)
}
