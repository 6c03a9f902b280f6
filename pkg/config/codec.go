package config

import (
	"encoding/base64"
	"fmt"
	"net/url"
	"os"
	"strings"
)

// Codec encrypts what Sluice hands Temporal: every payload of the chat and
// healing workflows (inputs, results, activity arguments and results,
// signals, queries, updates, memos, failure messages) is sealed with
// AES-256-GCM before it leaves the process, so the Temporal server and its
// database hold ciphertext. Off by default: turning it on does not touch
// histories already written, which stay readable (see docs/encryption.md).
type Codec struct {
	Enabled bool `yaml:"enabled"`
	// ActiveKey is the id of the key that encrypts; every listed key
	// decrypts. To rotate, list a new key, make it active, and drop the
	// old one only once the histories it sealed have aged out of the
	// namespace's retention.
	ActiveKey string `yaml:"active_key"`
	// Keys are the AES-256 keys, each 32 random bytes in base64
	// (openssl rand -base64 32), read at start from a file or a variable.
	Keys []CodecKey `yaml:"keys"`
	// UIOrigins are the origins of Temporal UIs allowed to call the codec
	// endpoint (/codec/decode, /codec/encode) from the browser (CORS),
	// such as https://temporal.example.com; empty: no browser may.
	UIOrigins []string `yaml:"ui_origins"`
}

// defaultCodec is off; the lists are empty rather than nil so that the
// defaults equal what the example file spells as [].
func defaultCodec() Codec {
	return Codec{Keys: []CodecKey{}, UIOrigins: []string{}}
}

// CodecKey is one encryption key. Its id is written beside every payload
// it seals, so that the payload finds its key after a rotation.
type CodecKey struct {
	ID string `yaml:"id"`
	// File holds the key in base64 (a mounted secret).
	File string `yaml:"file"`
	// Env names the variable that holds the key in base64. Variables
	// whose name starts with SLUICE_CODEC_KEY_ are left for keys (they
	// are no settings).
	Env string `yaml:"env"`
	// Secret is the key itself: Load reads it from File or Env. Only code
	// (tests) sets it directly.
	Secret []byte `yaml:"-"`
	// problem is why Load could not read the key, reported by validate.
	problem string
}

// codecKeyEnvPrefix starts variables that hold keys rather than settings.
const codecKeyEnvPrefix = "SLUICE_CODEC_KEY_"

// readKeys reads each key's secret from its file or variable, for
// validate to check; what goes wrong is kept to be reported with the
// field's name.
func (c *Codec) readKeys(environ []string) {
	env := envList(environ)
	for i := range c.Keys {
		k := &c.Keys[i]
		var raw string
		switch {
		case k.File != "" && k.Env != "":
			k.problem = "set exactly one of file and env"
			continue
		case k.File != "":
			b, err := os.ReadFile(k.File)
			if err != nil {
				k.problem = fmt.Sprintf("read the key: %v", err)
				continue
			}
			raw = string(b)
		case k.Env != "":
			v, ok := env.LookupEnv(k.Env)
			if !ok {
				k.problem = fmt.Sprintf("variable %s is not set", k.Env)
				continue
			}
			raw = v
		default:
			continue
		}
		secret, err := base64.StdEncoding.DecodeString(strings.TrimSpace(raw))
		if err != nil {
			k.problem = "must be base64 (openssl rand -base64 32)"
			continue
		}
		k.Secret = secret
	}
}

func (c Codec) validate(v *validator) {
	for i, o := range c.UIOrigins {
		field := fmt.Sprintf("codec.ui_origins[%d]", i)
		v.httpURL(field, o)
		// A browser's Origin has no path, and is compared as it is.
		if u, err := url.Parse(o); err == nil && u.Host != "" && (u.Path != "" || u.RawQuery != "") {
			v.add(field, "must be an origin (scheme://host[:port], no path), got %q", o)
		}
	}
	if !c.Enabled {
		return
	}
	if len(c.Keys) == 0 {
		v.add("codec.keys", "must list at least one key when codec.enabled is true")
	}
	seen := map[string]bool{}
	active := false
	for i, k := range c.Keys {
		field := fmt.Sprintf("codec.keys[%d]", i)
		v.uniqueName(seen, field+".id", k.ID, fmt.Sprintf("duplicate key id %q", k.ID))
		active = active || k.ID == c.ActiveKey
		switch {
		case k.problem != "":
			v.add(field, "%s", k.problem)
		case len(k.Secret) == 0 && k.File == "" && k.Env == "":
			v.add(field, "set exactly one of file and env")
		case len(k.Secret) != 32:
			// The length only: the key itself must not reach a log.
			v.add(field, "must be 32 bytes (AES-256) in base64 (openssl rand -base64 32), got %d bytes", len(k.Secret))
		}
	}
	if !active && len(c.Keys) > 0 {
		v.add("codec.active_key", "must name one of codec.keys, got %q", c.ActiveKey)
	}
}
