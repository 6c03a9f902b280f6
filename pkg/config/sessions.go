package config

import "time"

// Sessions configures conversation memory (/v1/chat with a session_id).
type Sessions struct {
	// TTL is how long a session outlives its last turn.
	TTL time.Duration `yaml:"ttl"`
	// MaxTurns is how many of its newest turns a session keeps.
	MaxTurns int `yaml:"max_turns"`
	// HistoryTokens bounds the earlier turns put into a prompt; the newest
	// that fit are kept (0: sessions are recorded but not replayed).
	HistoryTokens int `yaml:"history_tokens"`
}

func defaultSessions() Sessions {
	return Sessions{TTL: 24 * time.Hour, MaxTurns: 20, HistoryTokens: 1024}
}

func (s Sessions) validate(v *validator) {
	v.duration("sessions.ttl", s.TTL)
	v.positive("sessions.max_turns", int64(s.MaxTurns))
	// A budget beyond what a pool takes is not an error: the oldest turns
	// of a prompt that does not fit are shed, after its context.
	if s.HistoryTokens < 0 {
		v.add("sessions.history_tokens", "must not be negative, got %d", s.HistoryTokens)
	}
}
