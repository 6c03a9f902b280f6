package openai

import (
	"net/http"
	"sort"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/door"
	"github.com/sluice-dev/sluice/pkg/openai"
	"github.com/sluice-dev/sluice/pkg/policy"
)

// modelsPath is OpenAI's model list, which the official clients call
// first (client.models.list()) and which tools use to fill a model menu.
const modelsPath = "/v1/models"

// listModels answers GET /v1/models with the models the pools' backends
// serve, each once, then the RAG aliases: sluice-rag (the default kb) and
// sluice-rag/<kb> for each kb the caller may ask, in OpenAI's shape. It
// is a read like any other: the caller is authenticated and charged to
// its tier's read limit.
func (s *Server) listModels(c echo.Context) error {
	who, err := s.auth.For(c, policy.RouteReads)
	if err != nil {
		return err
	}
	seen := map[string]bool{}
	var ids []string
	for _, p := range s.cfg.Pools.ByName() {
		if p.Model != "" && !seen[p.Model] {
			seen[p.Model] = true
			ids = append(ids, p.Model)
		}
	}
	sort.Strings(ids)
	if s.embeddings != nil {
		ids = append(ids, s.cfg.Embedding.Model)
	}
	kbs, err := s.door.KBs().Readable(c.Request().Context(), who)
	if err != nil {
		return err
	}
	ids = append(ids, door.RAGModel)
	for _, kb := range kbs {
		ids = append(ids, door.RAGModel+"/"+kb)
	}
	list := openai.ModelList{Object: openai.ObjectList, Data: make([]openai.Model, len(ids))}
	for i, id := range ids {
		// OpenAI's created is when the model was made; a gateway knows
		// when it started serving it, this process's start.
		list.Data[i] = openai.Model{ID: id, Object: openai.ObjectModel, Created: s.builtAt.Unix(), OwnedBy: "sluice"}
	}
	return c.JSON(http.StatusOK, list)
}

// IsPath reports the routes whose errors take OpenAI's shape.
func IsPath(path string) bool {
	return path == chatCompletionsPath || strings.HasPrefix(path, responsesPath) || strings.HasPrefix(path, filesPath) ||
		path == modelsPath || path == embeddingsPath
}
