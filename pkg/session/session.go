// Package session keeps the recent turns of chat sessions in Redis, so
// that a follow-up question is asked with what came before it — including
// the turns that were not answered (a turn refused for want of capacity is
// recorded as such, so the next turn knows the earlier question is still
// open).
package session

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-dev/sluice/pkg/prompt"
	"github.com/sluice-dev/sluice/pkg/request"
)

var (
	//go:embed lua/append.lua
	appendLua    string
	appendScript = redis.NewScript(appendLua)
)

// Turn is one request of a session and what became of it.
type Turn struct {
	// RequestID must stay the first field: the append script finds a
	// retried turn by its encoded prefix.
	RequestID string    `json:"request_id"`
	Query     string    `json:"query"`
	Answer    string    `json:"answer,omitempty"`
	Outcome   string    `json:"outcome"`
	Reason    string    `json:"reason,omitempty"`
	At        time.Time `json:"at"`
}

// Exchange is the turn as the model sees it in a later prompt. A turn
// that was not answered says so in the assistant's place: the model then
// knows the earlier question is still open, instead of seeing the same
// question twice with no reply in between.
func (t Turn) Exchange() prompt.Exchange {
	switch t.Outcome {
	case request.OutcomeDone, request.OutcomeTruncated:
		return prompt.Exchange{User: t.Query, Assistant: t.Answer}
	case request.OutcomeRejected:
		return prompt.Exchange{User: t.Query, Assistant: "[Not answered: the system was busy and the user was asked to retry.]"}
	case request.OutcomeCancelled:
		return prompt.Exchange{User: t.Query, Assistant: "[Not answered: the request was cancelled.]"}
	default:
		return prompt.Exchange{User: t.Query, Assistant: "[Not answered: the request failed.]"}
	}
}

// Store keeps sessions in Redis, each a list of its newest turns.
type Store struct {
	rdb      Redis
	prefix   string
	ttl      time.Duration
	maxTurns int
}

// Options configures a Store.
type Options struct {
	KeyPrefix string
	// TTL is how long a session outlives its last turn.
	TTL time.Duration
	// MaxTurns is how many of its newest turns a session keeps.
	MaxTurns int
}

// Redis is what a Store needs of a go-redis client.
type Redis interface {
	redis.Scripter
	LRange(ctx context.Context, key string, start, stop int64) *redis.StringSliceCmd
	Del(ctx context.Context, keys ...string) *redis.IntCmd
}

// New returns a Store.
func New(rdb Redis, opts Options) (*Store, error) {
	if opts.TTL < time.Millisecond || opts.MaxTurns < 1 {
		return nil, fmt.Errorf("session store: needs a TTL and MaxTurns >= 1 (got %v, %d)", opts.TTL, opts.MaxTurns)
	}
	return &Store{rdb: rdb, prefix: opts.KeyPrefix, ttl: opts.TTL, maxTurns: opts.MaxTurns}, nil
}

// Owner is whom a session belongs to: a user of a tenant. Another user of
// the same tenant, or another tenant, naming the same session id names
// another session: ids are the client's words, not secrets.
type Owner struct {
	Tenant, User string
}

// Key is the Redis key of an owner's session. Each part's length goes
// before it, so that no owner and id can spell another's. ("usess", not
// the "sess" of sessions that belonged to a whole tenant: such an old key
// must not read as some user's session.)
func (s *Store) Key(o Owner, id string) string {
	return s.prefix + "usess:" + strconv.Itoa(len(o.Tenant)) + ":" + o.Tenant + ":" +
		strconv.Itoa(len(o.User)) + ":" + o.User + ":" + id
}

// Append records a turn; a turn already recorded for its request is not
// recorded again (Append may be retried).
func (s *Store) Append(ctx context.Context, o Owner, id string, t Turn) error {
	if t.RequestID == "" {
		return errors.New("session turn without a request id")
	}
	b, err := json.Marshal(t)
	if err != nil {
		return fmt.Errorf("encode turn of %s: %w", t.RequestID, err)
	}
	id8, _ := json.Marshal(t.RequestID)
	marker := `{"request_id":` + string(id8) + `,`
	err = appendScript.Run(ctx, s.rdb, []string{s.Key(o, id)},
		marker, b, s.maxTurns, s.ttl.Milliseconds()).Err()
	if err != nil {
		return fmt.Errorf("append turn of %s to session %s: %w", t.RequestID, id, err)
	}
	return nil
}

// Turns returns a session's turns, oldest first; none for a session that
// does not exist (or expired).
func (s *Store) Turns(ctx context.Context, o Owner, id string) ([]Turn, error) {
	raw, err := s.rdb.LRange(ctx, s.Key(o, id), 0, -1).Result()
	if err != nil {
		return nil, fmt.Errorf("read session %s: %w", id, err)
	}
	turns := make([]Turn, 0, len(raw))
	for _, r := range raw {
		var t Turn
		if err := json.Unmarshal([]byte(r), &t); err != nil {
			return nil, fmt.Errorf("decode a turn of session %s: %w", id, err)
		}
		turns = append(turns, t)
	}
	return turns, nil
}

// Forget deletes a session; it reports whether there was one.
func (s *Store) Forget(ctx context.Context, o Owner, id string) (bool, error) {
	n, err := s.rdb.Del(ctx, s.Key(o, id)).Result()
	if err != nil {
		return false, fmt.Errorf("forget session %s: %w", id, err)
	}
	return n > 0, nil
}

// Exchanges returns turns as the model sees them, oldest first.
func Exchanges(turns []Turn) []prompt.Exchange {
	out := make([]prompt.Exchange, len(turns))
	for i, t := range turns {
		out[i] = t.Exchange()
	}
	return out
}

// History returns the session's newest turns that fit budget tokens of a
// prompt b builds (newest first, never a gap), and the tokens they add.
// The door and admission route by that count and the stream builds its
// prompt from the turns, so all three read a session the same way.
func (s *Store) History(ctx context.Context, b *prompt.Builder, o Owner, id string, budget int) ([]prompt.Exchange, int, error) {
	if budget <= 0 {
		return nil, 0, nil
	}
	turns, err := s.Turns(ctx, o, id)
	if err != nil {
		return nil, 0, err
	}
	ex, n := b.FitHistory(Exchanges(turns), budget)
	return ex, n, nil
}
