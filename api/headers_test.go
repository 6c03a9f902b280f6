package api

import (
	"bufio"
	"net/http"
	"strings"
	"testing"
)

// Headers beyond maxHeaderBytes are refused with 431 before a handler
// runs; headers as large as a proxy passes are served.
func TestHeadersAreBounded(t *testing.T) {
	_, _, addr := serve(t, nil)
	const head = "GET /healthz HTTP/1.1\r\nHost: sluice\r\nX-Pad: "
	c := dialFrom(t, "127.0.0.1", addr)
	if resp, body := roundTrip(t, c, bufio.NewReader(c), head+strings.Repeat("a", 16<<10)+"\r\n\r\n"); resp.StatusCode != http.StatusOK {
		t.Errorf("16 KiB of headers: %d %s; want 200", resp.StatusCode, body)
	}
	// As much as net/http reads of headers (the bound and 4 KiB of slack)
	// and no end: the server has read all that was sent when it refuses,
	// so it closes cleanly instead of resetting what the test reads.
	c = dialFrom(t, "127.0.0.1", addr)
	if resp, body := roundTrip(t, c, bufio.NewReader(c), head+strings.Repeat("a", maxHeaderBytes+4096-len(head))); resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("%d bytes of headers: %d %s; want 431", maxHeaderBytes+4096, resp.StatusCode, body)
	}
}
