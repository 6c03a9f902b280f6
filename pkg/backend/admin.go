package backend

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
)

// adminConfig is the part of llmsim's /admin/config SetBatch uses.
type adminConfig struct {
	MaxNumSeqs *int `json:"max_num_seqs,omitempty"`
}

// SetBatch sets the backend's running-batch cap (max_num_seqs) through
// GET and POST /admin/config; a backend already at n is not written.
// applied is false, without an error, for a backend without that API (it
// answers 404 or 405: vLLM, TGI): the caller's permit count is then the
// only batch control it has.
func (c *Client) SetBatch(ctx context.Context, base string, n int) (applied bool, err error) {
	base = Base(base)
	url := base + "/admin/config"
	cur, ok, err := c.batch(ctx, url)
	switch {
	case err != nil:
		return false, fmt.Errorf("set max_num_seqs of %s to %d: %w", base, n, err)
	case !ok:
		return false, nil
	case cur == n:
		return true, nil
	}
	raw, err := json.Marshal(adminConfig{MaxNumSeqs: &n})
	if err != nil {
		return false, fmt.Errorf("set max_num_seqs of %s to %d: %w", base, n, err)
	}
	err = c.do(ctx, http.MethodPost, url, http.Header{"Content-Type": {"application/json"}}, raw, func(resp *http.Response) error {
		if resp.StatusCode != http.StatusOK {
			return statusError(resp)
		}
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("set max_num_seqs of %s to %d: %w", base, n, err)
	}
	return true, nil
}

// batch reads the backend's max_num_seqs; ok is false when the backend
// has no admin API.
func (c *Client) batch(ctx context.Context, url string) (n int, ok bool, err error) {
	var cur adminConfig
	err = c.do(ctx, http.MethodGet, url, nil, nil, func(resp *http.Response) error {
		switch resp.StatusCode {
		case http.StatusOK:
		case http.StatusNotFound, http.StatusMethodNotAllowed:
			return nil
		default:
			return statusError(resp)
		}
		if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&cur); err != nil {
			return fmt.Errorf("decode answer: %w", err)
		}
		if cur.MaxNumSeqs == nil {
			return fmt.Errorf("answer has no max_num_seqs")
		}
		return nil
	})
	if err != nil || cur.MaxNumSeqs == nil {
		return 0, false, err
	}
	return *cur.MaxNumSeqs, true, nil
}
