package testenv

import (
	"encoding/json"
	"net/http"

	"github.com/sluice-dev/sluice/pkg/embed"
)

// EmbeddingsRequest is the body of OpenAI's POST /v1/embeddings, as the
// fakes here read it.
type EmbeddingsRequest struct {
	Model      string   `json:"model"`
	Input      []string `json:"input"`
	Dimensions int      `json:"dimensions"`
}

// ServeLocalEmbeddings answers an embeddings request in OpenAI's shape
// with the built-in local embedder's vectors (at the requested dimensions;
// its default when none), so that a fake remote embedder still retrieves
// the right documents. It returns the request it answered; false if it
// answered with an error.
func ServeLocalEmbeddings(w http.ResponseWriter, r *http.Request) (EmbeddingsRequest, bool) {
	var req EmbeddingsRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return req, false
	}
	vecs, err := embed.NewLocal(embed.LocalOptions{Dims: req.Dimensions}).Embed(r.Context(), req.Input)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return req, false
	}
	type item struct {
		Index     int       `json:"index"`
		Embedding []float32 `json:"embedding"`
	}
	var out struct {
		Data []item `json:"data"`
	}
	for i, v := range vecs {
		out.Data = append(out.Data, item{i, v})
	}
	_ = json.NewEncoder(w).Encode(out)
	return req, true
}
