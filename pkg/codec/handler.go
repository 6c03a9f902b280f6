package codec

import (
	"fmt"
	"net/http"

	"go.temporal.io/sdk/converter"
)

// Handler serves the Temporal codec server protocol for k: POST
// <prefix>/decode and <prefix>/encode, a JSON Payloads in and out, as
// the Temporal UI and `temporal --codec-endpoint` call it. It does no
// authentication: whoever may call it reads every history in the clear,
// so the caller must guard it. Bodies above maxBody bytes are refused.
func Handler(k *Keyring, maxBody int64) http.Handler {
	inner := converter.NewPayloadCodecHTTPHandler(k)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > maxBody {
			http.Error(w, fmt.Sprintf("payloads over %d bytes", maxBody), http.StatusRequestEntityTooLarge)
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxBody)
		inner.ServeHTTP(w, r)
	})
}
