// Package alert posts alerts to a webhook as JSON: a chat-ops bot, a
// pager's events API or anything else that takes a POST.
package alert

import (
	"errors"
	"time"
)

// Alert is one alert, as the webhook receives it.
type Alert struct {
	Pool    string `json:"pool"`
	Level   string `json:"level"`
	Message string `json:"message"`
	// At is when the alert was raised; zero is when it is sent.
	At time.Time `json:"at"`
	// Health is what the pool looked like, sent as its own JSON; the
	// package does not need its shape.
	Health any `json:"health"`
}

// ErrInvalid means the post could not be built (a malformed URL):
// retrying does not help.
var ErrInvalid = errors.New("build alert webhook request")
