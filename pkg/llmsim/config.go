package llmsim

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/pkg/openai"
	"github.com/sluice-dev/sluice/pkg/tokens"
)

// Scheduling modes.
const (
	// ModeContinuous schedules at token granularity: finished sequences
	// leave the batch at once and waiting ones join at the next step.
	ModeContinuous = "continuous"
	// ModeStatic forms a batch only when the previous batch has finished
	// entirely; it exists to show what continuous batching buys.
	ModeStatic = "static"
)

// Bounds on run-time changes, so that an admin call cannot start thousands
// of scheduler goroutines by mistake.
const (
	MaxReplicas   = 64
	MaxMaxNumSeqs = 4096
)

// Config describes the simulated deployment. Start from DefaultConfig and
// override what a test or benchmark needs.
type Config struct {
	// Model is the only model served; it is reported in responses and as
	// the model_name label of every metric.
	Model string
	// Encoding is the tiktoken encoding used to count prompt tokens.
	Encoding string
	// Replicas is the number of simulated engines behind the one endpoint.
	Replicas int
	// MaxNumSeqs caps the running batch of each replica (vLLM --max-num-seqs).
	MaxNumSeqs int
	// KVCacheBlocks is the paged KV cache of each replica, in blocks. It also
	// bounds the context of one request: KVCacheBlocks*BlockSize tokens.
	KVCacheBlocks int
	// BlockSize is the number of tokens one KV block holds.
	BlockSize int
	// MaxModelLen is the model's context in tokens (vLLM's
	// --max-model-len): a longer prompt is refused with 400
	// context_length_exceeded. 0 is the whole KV cache of a replica.
	MaxModelLen int
	// PrefillPerToken is charged, in the step that admits a sequence, for
	// every token it must prefill (prompt, plus generated tokens after a
	// preemption).
	PrefillPerToken time.Duration
	// DecodeBase is the fixed cost of one decode step.
	DecodeBase time.Duration
	// DecodePerSeq is the extra cost of one decode step per sequence in the
	// batch; it is what makes a full batch slower for every member.
	DecodePerSeq time.Duration
	// TimeScale multiplies every simulated duration to get wall time:
	// 1 is real time, 0.01 runs a hundred times faster. Metrics and
	// latencies reported by the simulator are in simulated time.
	TimeScale float64
	// Seed makes generated answers reproducible: the same seed and prompt
	// always give the same answer.
	Seed int64
	// Mode is ModeContinuous or ModeStatic.
	Mode string
	// DefaultMaxTokens is the output budget of a request that sets neither
	// max_tokens nor max_completion_tokens.
	DefaultMaxTokens int
	// AnswerMinTokens and AnswerMaxTokens bound the natural length of an
	// answer, which is derived from the seed and the prompt. An answer that
	// reaches its natural length ends with finish_reason "stop"; one cut by
	// the output budget ends with "length".
	AnswerMinTokens int
	AnswerMaxTokens int
	// Fault is every replica's fault from the start; the zero Fault (the
	// default) is a healthy server. POST /admin/config changes it.
	Fault Fault
	// RefuseParams names sampling parameters (of openai.SamplingParams,
	// or "n") the simulated backend does not support, as a backend
	// without logit_bias, say, does not: a request that sets one is
	// refused with 400 "<param> is not supported by this model"; with
	// "n", a request for other than one choice is. None by default; POST
	// /admin/config changes it.
	RefuseParams []string `json:"refuse_params,omitempty" yaml:"refuse_params,omitempty"`
}

// DefaultConfig returns a single replica sized like a small GPU serving a
// 7B-class model: 16 sequences, 2048 blocks of 16 tokens, about 60
// tokens/s per sequence at a small batch.
func DefaultConfig() Config {
	return Config{
		Model:            "sluice-sim",
		Encoding:         tokens.CL100K,
		Replicas:         1,
		MaxNumSeqs:       16,
		KVCacheBlocks:    2048,
		BlockSize:        16,
		PrefillPerToken:  50 * time.Microsecond,
		DecodeBase:       15 * time.Millisecond,
		DecodePerSeq:     500 * time.Microsecond,
		TimeScale:        1,
		Seed:             1,
		Mode:             ModeContinuous,
		DefaultMaxTokens: 512,
		AnswerMinTokens:  40,
		AnswerMaxTokens:  160,
	}
}

// Validate reports every bad field by name.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.Model == "" {
		bad("Model must not be empty")
	}
	if c.Encoding != tokens.CL100K && c.Encoding != tokens.O200K {
		bad("Encoding must be %s or %s, got %q", tokens.CL100K, tokens.O200K, c.Encoding)
	}
	if c.Replicas < 1 || c.Replicas > MaxReplicas {
		bad("Replicas must be in 1..%d, got %d", MaxReplicas, c.Replicas)
	}
	if c.MaxNumSeqs < 1 || c.MaxNumSeqs > MaxMaxNumSeqs {
		bad("MaxNumSeqs must be in 1..%d, got %d", MaxMaxNumSeqs, c.MaxNumSeqs)
	}
	if c.KVCacheBlocks < 1 {
		bad("KVCacheBlocks must be >= 1, got %d", c.KVCacheBlocks)
	}
	if c.BlockSize < 1 {
		bad("BlockSize must be >= 1, got %d", c.BlockSize)
	}
	if c.KVCacheBlocks >= 1 && c.BlockSize >= 1 && c.KVCacheBlocks*c.BlockSize < 2 {
		bad("KVCacheBlocks*BlockSize must hold at least 2 tokens, got %d", c.KVCacheBlocks*c.BlockSize)
	}
	if c.MaxModelLen < 0 || (c.MaxModelLen > 0 && c.MaxModelLen > c.KVCacheBlocks*c.BlockSize) {
		bad("MaxModelLen must be in 0..KVCacheBlocks*BlockSize (%d), got %d", c.KVCacheBlocks*c.BlockSize, c.MaxModelLen)
	}
	if c.PrefillPerToken < 0 {
		bad("PrefillPerToken must be >= 0, got %s", c.PrefillPerToken)
	}
	// A zero step would make a busy scheduler spin without yielding.
	if c.DecodeBase <= 0 {
		bad("DecodeBase must be > 0, got %s", c.DecodeBase)
	}
	if c.DecodePerSeq < 0 {
		bad("DecodePerSeq must be >= 0, got %s", c.DecodePerSeq)
	}
	if !(c.TimeScale > 0) || math.IsInf(c.TimeScale, 0) {
		bad("TimeScale must be a finite number > 0, got %v", c.TimeScale)
	}
	if c.Mode != ModeContinuous && c.Mode != ModeStatic {
		bad("Mode must be %q or %q, got %q", ModeContinuous, ModeStatic, c.Mode)
	}
	if c.DefaultMaxTokens < 1 {
		bad("DefaultMaxTokens must be >= 1, got %d", c.DefaultMaxTokens)
	}
	if c.AnswerMinTokens < 1 {
		bad("AnswerMinTokens must be >= 1, got %d", c.AnswerMinTokens)
	}
	if c.AnswerMaxTokens < c.AnswerMinTokens {
		bad("AnswerMaxTokens must be >= AnswerMinTokens (%d), got %d", c.AnswerMinTokens, c.AnswerMaxTokens)
	}
	if err := c.Fault.Validate(); err != nil {
		bad("Fault: %w", err)
	}
	if err := validateRefuseParams(c.RefuseParams); err != nil {
		bad("RefuseParams %w", err)
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("invalid llmsim config: %w", errors.Join(errs...))
}

// refusableParams are the parameters RefuseParams may name.
var refusableParams = append(slices.Clip(openai.SamplingParams), openai.ParamN)

// validateRefuseParams checks that every refused parameter is one a
// request can set, so that a misspelt one is not silently supported.
func validateRefuseParams(names []string) error {
	for _, name := range names {
		if !slices.Contains(refusableParams, name) {
			return fmt.Errorf("names %q, which is not one of %s", name, strings.Join(refusableParams, ", "))
		}
	}
	return nil
}

// contextTokens is the longest context one sequence can have: the
// model's, or all of a replica's KV cache.
func (c Config) contextTokens() int {
	if c.MaxModelLen > 0 {
		return c.MaxModelLen
	}
	return c.KVCacheBlocks * c.BlockSize
}
