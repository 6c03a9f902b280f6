// Package backend calls an inference backend's operational endpoints: the
// Prometheus /metrics that vLLM and pkg/llmsim export, and the run-time
// /admin/config that pkg/llmsim serves. The OpenAI API of the same server
// is pkg/llm's.
//
// Every request has a timeout of its own, so that a caller asking several
// backends at once is not held past its deadline by one slow replica.
package backend

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"strings"
	"time"
)

// DefaultTimeout bounds one request when Client.Timeout is zero.
const DefaultTimeout = 2 * time.Second

// Client calls backends' operational endpoints; the zero value is ready
// to use. Its methods take a backend's server root (see Base); an OpenAI
// base URL ending in "/v1" is taken as well.
type Client struct {
	// HTTP sends the requests; nil is http.DefaultClient.
	HTTP *http.Client
	// Timeout bounds each request; zero is DefaultTimeout.
	Timeout time.Duration
}

// Base is an endpoint's server root: the OpenAI base URL without a
// trailing "/v1", where /metrics and /admin/config are served.
func Base(endpoint string) string {
	base := strings.TrimRight(endpoint, "/")
	return strings.TrimSuffix(base, "/v1")
}

// maxDrainBytes bounds what is read of an answer nobody uses, so that the
// connection can be reused without reading a huge body.
const maxDrainBytes = 64 << 10

// do sends one request under the client's timeout, with body if not nil,
// and hands the answer to read before its body is closed; read's error is
// wrapped with the method and URL (a transport error already names them).
func (c *Client) do(ctx context.Context, method, url string, header http.Header, body []byte, read func(*http.Response) error) error {
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return fmt.Errorf("build %s %s: %w", method, url, err)
	}
	maps.Copy(req.Header, header)
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	err = read(resp)
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxDrainBytes))
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, url, err)
	}
	return nil
}

// statusError is an answer with an unexpected status.
func statusError(resp *http.Response) error {
	return fmt.Errorf("answered %s", resp.Status)
}
