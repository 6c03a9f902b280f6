// Package openai serves OpenAI's API over Sluice: chat completions
// (streamed in OpenAI's chunk format or answered whole), the model list
// and embeddings, so that OpenAI's clients work unchanged. A chat
// completion is a chat request like any other: it goes through the same
// door and runs the same workflow; only its body and its answer are
// shaped as OpenAI's. Errors on these routes take OpenAI's shape
// (ErrorBody).
package openai

import (
	"context"
	"log/slog"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/door"
	"github.com/sluice-dev/sluice/follow"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/files"
	"github.com/sluice-dev/sluice/pkg/prompt"
	"github.com/sluice-dev/sluice/pkg/responses"
)

// Auth names the caller of a request, as the HTTP API does for its own
// routes (keys, scopes, bans).
type Auth interface {
	// Chat names a caller that may spend a model's time.
	Chat(c echo.Context) (door.Caller, error)
	// For names a caller and charges the request to its limit for route
	// (a policy.Route*).
	For(c echo.Context, route string) (door.Caller, error)
}

// Embeddings computes a text's vector through the embedding cache
// (embed.Cache): the vector of the text as the cache normalises it, which
// is what retrieval compares a query by.
type Embeddings interface {
	// Model names the embedder's model and dimensions.
	Model() string
	Get(ctx context.Context, text string) (vec []float32, tier string, err error)
}

// Server serves the OpenAI routes.
type Server struct {
	cfg     config.Config
	door    *door.Door
	follow  *follow.Follower
	auth    Auth
	prompts *prompt.Builder
	// embeddings serves POST /v1/embeddings; nil refuses it.
	embeddings Embeddings
	// responses keeps stored responses, and events is the requests' event
	// log their answers are read from until they are stored; responses
	// nil: none is stored.
	responses *responses.Store
	events    *events.Log
	// files keeps uploaded files; nil: none is kept.
	files *files.Store
	// builtAt is when the server was built: the models' created time.
	builtAt time.Time
	logger  *slog.Logger
}

// Options are the Server's dependencies.
type Options struct {
	Config     config.Config
	Door       *door.Door
	Follow     *follow.Follower
	Auth       Auth
	Prompts    *prompt.Builder
	Embeddings Embeddings
	// Responses and Events serve stored responses (nil: not stored).
	Responses *responses.Store
	Events    *events.Log
	// Files keeps uploaded files (nil: /v1/files is 404).
	Files  *files.Store
	Logger *slog.Logger
}

// New builds the OpenAI routes' server.
func New(opts Options) *Server {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Server{cfg: opts.Config, door: opts.Door, follow: opts.Follow, auth: opts.Auth, prompts: opts.Prompts, embeddings: opts.Embeddings,
		responses: opts.Responses, events: opts.Events, files: opts.Files, builtAt: time.Now(), logger: opts.Logger}
}

// Register adds the OpenAI routes to e.
func (s *Server) Register(e *echo.Echo) {
	e.POST(chatCompletionsPath, s.postChatCompletions)
	e.POST(responsesPath, s.postResponses)
	e.GET(responsesPath+"/:id", s.getResponse)
	e.DELETE(responsesPath+"/:id", s.deleteResponse)
	e.POST(responsesPath+"/:id/cancel", s.cancelResponse)
	e.GET(responsesPath+"/:id/input_items", s.listInputItems)
	e.POST(filesPath, s.postFile)
	e.GET(filesPath, s.listFiles)
	e.GET(filesPath+"/:id", s.getFile)
	e.GET(filesPath+"/:id/content", s.fileContent)
	e.DELETE(filesPath+"/:id", s.deleteFile)
	e.GET(modelsPath, s.listModels)
	e.POST(embeddingsPath, s.postEmbeddings)
}
