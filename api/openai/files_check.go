package openai

import (
	"errors"

	"github.com/sluice-dev/sluice/pkg/batchfile"
	"github.com/sluice-dev/sluice/pkg/refusal"
)

// checkBatchBody checks a batch line's body as its endpoint checks a
// request's, up to the door (a kb's existence and the caller's rights
// to it are checked when the line runs): a line the endpoint would
// refuse is a bad line of the file. A batch's line is answered whole and
// stands alone, so it may not stream, run in the background or continue
// a stored response.
func (s *Server) checkBatchBody(url string, body []byte) error {
	err := s.checkBody(url, body)
	var ae *refusal.Error
	if errors.As(err, &ae) {
		return &batchfile.CheckError{Code: ae.Code, Param: ae.Param, Message: ae.Message}
	}
	return err
}

func (s *Server) checkBody(url string, body []byte) error {
	switch url {
	case batchfile.ChatCompletions:
		cr, req, err := parseCompletionRequest(body, "")
		if err != nil {
			return err
		}
		if cr.Stream {
			return paramError("stream", "invalid_value", "a batch's line is answered whole: stream must be false")
		}
		return withParam(s.door.Validate(&req))
	case batchfile.Responses:
		rr, req, err := parseResponseRequest(body, "")
		switch {
		case err != nil:
			return err
		case rr.Stream:
			return paramError("stream", "invalid_value", "a batch's line is answered whole: stream must be false")
		case rr.Background:
			return paramError("background", "invalid_value", "a batch's lines run in the background already")
		case rr.PreviousResponseID != "":
			return paramError("previous_response_id", "unsupported_parameter", "a batch's line stands alone: it cannot continue a stored response")
		}
		return withResponseParam(s.door.Validate(&req))
	case batchfile.Embeddings:
		_, err := s.parseEmbeddingRequest(body)
		return err
	}
	return paramError("url", "invalid_value", "no batch endpoint %q", url)
}
