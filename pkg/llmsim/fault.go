package llmsim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"time"
)

// maxTokenDelay bounds a slow replica's extra step time, so that a typo
// cannot make a replica take hours per token.
const maxTokenDelay = time.Minute

// Fault is a failure a replica shows when told to, for tests of how a
// gateway copes with a bad backend. The zero Fault is a healthy replica;
// nothing ever turns a fault on but Config.Fault, the flags and POST
// /admin/config, so the simulator's timing stays a model of a working
// server unless a test says otherwise.
type Fault struct {
	// StallFirstToken: the replica takes requests (their stream's headers
	// go out at once, as always) and admits them, but never produces a
	// token: a hung engine. Stalled sequences keep their batch slot and
	// KV blocks until their client goes away.
	StallFirstToken bool
	// StallAfterTokens, if > 0: a sequence stops after this many tokens
	// (at once if it is already past them) and holds its slot and blocks
	// until its client goes away.
	StallAfterTokens int
	// ErrorStatus, if set (500 to 599), refuses every request sent to the
	// replica with this HTTP status before it is queued. A replica that
	// refuses at once looks idle to the least-loaded balancer and draws
	// more than its share, as a failing replica does behind a real one.
	ErrorStatus int
	// TokenDelay is added to every decode step of the replica, in
	// simulated time: a slow replica (a throttled GPU, a noisy
	// neighbour). Every sequence in its batch waits for it.
	TokenDelay time.Duration
	// DieAfterTokens, if > 0: a stream whose answer reaches this many
	// tokens has its connection dropped at once, without a finish or an
	// error event (a crashed replica, a broken proxy). It counts the
	// answer's tokens, those of a continued assistant prefix too, so a
	// continuation that starts past it is not cut again.
	DieAfterTokens int
}

// faultJSON is a Fault on the wire, durations in seconds as in
// RuntimeConfig.
type faultJSON struct {
	StallFirstToken   bool    `json:"stall_first_token,omitempty"`
	StallAfterTokens  int     `json:"stall_after_tokens,omitempty"`
	ErrorStatus       int     `json:"error_status,omitempty"`
	TokenDelaySeconds float64 `json:"token_delay_seconds,omitempty"`
	DieAfterTokens    int     `json:"die_after_tokens,omitempty"`
}

// MarshalJSON writes the fault as /admin/config shows it.
func (f Fault) MarshalJSON() ([]byte, error) {
	return json.Marshal(faultJSON{
		StallFirstToken: f.StallFirstToken, StallAfterTokens: f.StallAfterTokens,
		ErrorStatus: f.ErrorStatus, TokenDelaySeconds: f.TokenDelay.Seconds(), DieAfterTokens: f.DieAfterTokens,
	})
}

// UnmarshalJSON reads a fault as POST /admin/config takes it; unknown
// fields are errors, so that a misspelt fault is not silently off.
func (f *Fault) UnmarshalJSON(b []byte) error {
	var w faultJSON
	if err := decodeStrict(b, &w); err != nil {
		return fmt.Errorf("decode fault: %w", err)
	}
	*f = Fault{
		StallFirstToken: w.StallFirstToken, StallAfterTokens: w.StallAfterTokens,
		ErrorStatus: w.ErrorStatus, TokenDelay: time.Duration(w.TokenDelaySeconds * float64(time.Second)),
		DieAfterTokens: w.DieAfterTokens,
	}
	return nil
}

// Validate reports every bad field of the fault.
func (f Fault) Validate() error {
	var errs []error
	if f.StallAfterTokens < 0 {
		errs = append(errs, fmt.Errorf("stall_after_tokens must be >= 0, got %d", f.StallAfterTokens))
	}
	if f.StallFirstToken && f.StallAfterTokens > 0 {
		errs = append(errs, errors.New("set stall_first_token or stall_after_tokens, not both"))
	}
	if f.DieAfterTokens < 0 {
		errs = append(errs, fmt.Errorf("die_after_tokens must be >= 0, got %d", f.DieAfterTokens))
	}
	if f.ErrorStatus != 0 && (f.ErrorStatus < 500 || f.ErrorStatus > 599) {
		errs = append(errs, fmt.Errorf("error_status must be 0 or 500..599, got %d", f.ErrorStatus))
	}
	if f.TokenDelay < 0 || f.TokenDelay > maxTokenDelay {
		errs = append(errs, fmt.Errorf("token_delay must be in 0..%s, got %s", maxTokenDelay, f.TokenDelay))
	}
	return errors.Join(errs...)
}

// stalls reports whether a sequence that has produced generated tokens
// gets no more.
func (f Fault) stalls(generated int) bool {
	return (f.StallFirstToken && generated == 0) || (f.StallAfterTokens > 0 && generated >= f.StallAfterTokens)
}

// dies reports whether a sequence that started at answer token start and
// has generated tokens since has its connection dropped now: when its
// answer reaches DieAfterTokens, unless it started there or past it.
func (f Fault) dies(start, generated int) bool {
	k := f.DieAfterTokens
	return k > 0 && start < k && start+generated >= k
}

// errDied is the end of a sequence whose replica drops its connection
// (Fault.DieAfterTokens); the handler aborts the response without a
// word.
var errDied = errors.New("simulated fault: connection dropped mid-answer")

// faults is the simulator's faults at one moment: the server-wide one, and
// those of single replicas (which replace it for them). It is never
// changed, only replaced, so replicas read it without a lock.
type faults struct {
	server   Fault
	replicas map[int]Fault
}

func (fs *faults) of(replica int) Fault {
	if f, ok := fs.replicas[replica]; ok {
		return f
	}
	return fs.server
}

// applyFaultsLocked installs the faults u sets; replicas names the
// replicas that exist, the only ones a fault can be set for. s.mu must be
// held.
func (s *Server) applyFaultsLocked(u ConfigUpdate, replicas map[int]bool) error {
	cur := s.faults.Load()
	next := &faults{server: cur.server, replicas: maps.Clone(cur.replicas)}
	if next.replicas == nil {
		next.replicas = map[int]Fault{}
	}
	if u.Fault != nil {
		next.server = *u.Fault
	}
	for id, f := range u.ReplicaFaults {
		if !replicas[id] {
			return fmt.Errorf("%w: replica_faults: no replica %d", ErrInvalidUpdate, id)
		}
		if f == nil {
			delete(next.replicas, id)
			continue
		}
		next.replicas[id] = *f
	}
	s.faults.Store(next)
	return nil
}

// validateFaults checks the faults an update sets.
func (u ConfigUpdate) validateFaults() []error {
	var errs []error
	if u.Fault != nil {
		if err := u.Fault.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("fault: %w", err))
		}
	}
	for id, f := range u.ReplicaFaults {
		if f == nil {
			continue
		}
		if err := f.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("replica_faults[%d]: %w", id, err))
		}
	}
	return errs
}

// faultStatus is the refusal of a replica told to fail with an HTTP
// status.
type faultStatus struct {
	replica int
	status  int
}

func (e *faultStatus) Error() string {
	return fmt.Sprintf("replica %d: simulated fault: %s", e.replica, http.StatusText(e.status))
}

// decodeStrict decodes JSON that must have no unknown fields.
func decodeStrict(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}
