package testenv

// The key that sealed the encrypted histories under
// tests/histories/encrypted. It is a TEST KEY, published with the source:
// never use it for real data. (Plain values: testenv may not import
// pkg/codec, which imports pkg/config, whose packages' tests import
// testenv.)
const CodecTestKeyID = "sluice-test-key"

// CodecTestKeySecret is the test key's 32 bytes.
var CodecTestKeySecret = []byte("sluice-test-codec-key-NOT-SECRET")
