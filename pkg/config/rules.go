package config

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"
)

// Rules that other packages own, held here as plain data so that config
// imports no Sluice package and still reports every bad value at load
// time with its field. rules_test.go keeps each equal to its owner's.

// The route names of the two pools (pkg/request's PoolShort and PoolLong),
// which are also their YAML keys under pools.
const (
	poolShort = "short"
	poolLong  = "long"
)

// keyScopes are the scopes a configured key may name (pkg/keys'
// AllScopes, in its order).
var keyScopes = []string{"chat", "ingest", "admin"}

// checkScopes refuses unknown and repeated scope names with pkg/keys'
// ParseScopes's words.
func checkScopes(names []string) error {
	seen := make([]string, 0, len(names))
	for _, n := range names {
		sc := strings.TrimSpace(n)
		if !slices.Contains(keyScopes, sc) {
			return fmt.Errorf("unknown scope %q (want one of %s)", n, strings.Join(keyScopes, ","))
		}
		if slices.Contains(seen, sc) {
			return fmt.Errorf("scope %q given twice", sc)
		}
		seen = append(seen, sc)
	}
	return nil
}

// keyHash is the hex SHA-256 a key is known by (pkg/keys' Hash).
func keyHash(plain string) string {
	sum := sha256.Sum256([]byte(plain))
	return hex.EncodeToString(sum[:])
}

// Knowledge base names and keys (pkg/kbref): a name is kbNameRule; a
// tenant's own kb is keyed "<tenant>/<name>", a shared one by its name.
const kbNameRule = "1-64 letters, digits, '-', '_' or '.'"

var kbName = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// key is the kb's key (pkg/kbref's Ref.Key).
func (k KnowledgeBase) key() string {
	if k.Shared || k.Tenant == "" {
		return k.Name
	}
	return k.Tenant + "/" + k.Name
}

// parseKBKey splits a kb key into its tenant ("" for a shared kb) and
// name; ok is false if it is neither form.
func parseKBKey(key string) (tenant, name string, ok bool) {
	i := strings.LastIndex(key, "/")
	if i < 0 {
		return "", key, kbName.MatchString(key)
	}
	tenant, name = key[:i], key[i+1:]
	return tenant, name, tenant != "" && kbName.MatchString(name)
}

// unsupportedChoices are what a pool may list as unsupported: OpenAI's n,
// the sampling parameters forwarded to a backend (pkg/openai's
// SamplingParams) and the content part types (pkg/openai's
// ContentPartTypes).
const paramN = "n"

var (
	forwardedParams  = []string{"temperature", "top_p", "stop", "seed", "presence_penalty", "frequency_penalty", "logit_bias", "response_format", "tools", "tool_choice", "parallel_tool_calls"}
	contentPartTypes = []string{"text", "image_url", "input_audio", "file"}
)

// healingStages are the latency series the healer can watch (pkg/request's
// TimedSeries, in pipeline order); it watches stageLLMFirstToken unless
// told otherwise.
var healingStages = []string{"embed", "answer_cache", "admission", "retrieval", "rerank", "llm_first_token", "llm", "ttft"}

const stageLLMFirstToken = "llm_first_token"

// The LLM client's default deadlines and breaker (pkg/llm's
// DefaultDeadlines and DefaultBreaker), which suit a real model.
const (
	defaultConnectTimeout    = 10 * time.Second
	defaultFirstTokenTimeout = 30 * time.Second
	defaultTokenIdleTimeout  = 15 * time.Second
	defaultBreakerFailures   = 5
	defaultBreakerOpenFor    = 10 * time.Second
	defaultSlowFirstToken    = 10 * time.Second
)
