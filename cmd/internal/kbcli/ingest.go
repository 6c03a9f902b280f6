package kbcli

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/cmd/internal/apiclient"
	"github.com/sluice-dev/sluice/pkg/ingest"
)

// pending is a document to send: with the hash of its JSON, which the
// state file keeps, and that JSON's size, which batches are cut by.
type pending struct {
	doc    ingest.Document
	sha256 string
	bytes  int
}

// ingestRun is one `kb ingest`: the files, what is known of them, and the
// tally so far.
type ingestRun struct {
	opts  options
	state *state
	known map[string]docState // the target's entries of state
	held  map[string]string   // id → revision the kb holds, for ids in known
	prog  *progress
	t     tally
}

// ingestFiles sends opts.paths' files to the kb, the ones it does not
// hold already, in batches, and prints a summary on env.Stdout.
func ingestFiles(ctx context.Context, opts options, env Env) error {
	entries, err := collect(opts.paths, opts.exts)
	if err != nil {
		return err
	}
	if len(entries) == 0 {
		return fmt.Errorf("no files to ingest in %s (extensions %s)", strings.Join(opts.paths, " "), strings.Join(opts.exts, ","))
	}
	st, err := loadState(opts.state)
	if err != nil {
		return err
	}
	mode := env.Progress
	if opts.quiet {
		mode = "none"
	}
	r := &ingestRun{opts: opts, state: st, known: st.target(opts.client.Base, opts.kb),
		prog: newProgress(env.Stderr, mode, opts.kb), t: tally{total: len(entries)}}
	if len(r.known) > 0 {
		if r.held, err = r.heldRevisions(ctx); err != nil {
			return err
		}
	}
	err = r.sendAll(ctx, entries)
	r.prog.finish()
	if errors.Is(err, context.Canceled) {
		return fmt.Errorf("interrupted with %d of %d files done; run the same command again to send the rest", r.t.done, r.t.total)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "kb %s: %d files: %d sent (%d changed, %d unchanged), %d already in the kb", opts.kb,
		r.t.total, r.t.changed+r.t.unchanged, r.t.changed, r.t.unchanged, r.t.kept)
	if r.t.version > 0 {
		fmt.Fprintf(env.Stdout, "; kb version %d", r.t.version)
	}
	fmt.Fprintln(env.Stdout)
	if r.t.problems > 0 {
		return fmt.Errorf("%d files could not be documents (listed above)", r.t.problems)
	}
	return nil
}

// sendAll reads the entries in order, skips those the kb holds already,
// and sends the rest in batches of opts.batch documents and at most
// opts.batchBytes.
func (r *ingestRun) sendAll(ctx context.Context, entries []entry) error {
	var batch []pending
	size := 0
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return err
		}
		p, err := e.document()
		if err != nil {
			r.t.done++
			r.t.problems++
			r.prog.note("skip %s: %s", e.file, strings.TrimPrefix(err.Error(), ingest.ErrInvalid.Error()+": "))
			continue
		}
		if k, ok := r.known[e.id]; ok && k.SHA256 == p.sha256 && r.held[e.id] == k.Rev {
			r.t.done++
			r.t.kept++
			if r.t.kept%100 == 0 {
				r.prog.update(r.t)
			}
			continue
		}
		if len(batch) > 0 && (len(batch) >= r.opts.batch || size+p.bytes > r.opts.batchBytes) {
			if err := r.send(ctx, batch); err != nil {
				return err
			}
			batch, size = nil, 0
		}
		batch, size = append(batch, p), size+p.bytes
	}
	if len(batch) > 0 {
		return r.send(ctx, batch)
	}
	r.prog.update(r.t)
	return nil
}

// send sends a batch and records what the kb made of it, in the tally
// and the state file. A batch the server finds too large is sent again as
// two halves, and later batches are cut to that size.
func (r *ingestRun) send(ctx context.Context, batch []pending) error {
	res, err := r.post(ctx, batch)
	var ae *apiclient.Error
	if errors.As(err, &ae) && ae.Status == http.StatusRequestEntityTooLarge && len(batch) > 1 &&
		(ae.Code == "too_many_documents" || ae.Code == "body_too_large") {
		half := len(batch) / 2
		r.opts.batch = max(1, min(r.opts.batch, half))
		r.prog.note("the server found %d documents too many for one request (%s); sending %d at a time", len(batch), ae.Code, half)
		if err := r.send(ctx, batch[:half]); err != nil {
			return err
		}
		return r.send(ctx, batch[half:])
	}
	if err != nil {
		return fmt.Errorf("send %s: %w", describe(batch), err)
	}
	for _, d := range res.Docs {
		for _, p := range batch {
			if p.doc.ID == d.ID {
				r.known[d.ID] = docState{SHA256: p.sha256, Rev: d.Rev}
				r.t.bytes += int64(p.bytes)
			}
		}
		if d.Changed {
			r.t.changed++
		} else {
			r.t.unchanged++
		}
	}
	r.t.done += len(batch)
	r.t.batches++
	r.t.version = res.Version
	if err := r.state.save(); err != nil {
		return err
	}
	r.prog.batch(r.t, len(batch))
	return nil
}

// Retries of a batch the server is too busy for (503 ingest_busy, 429):
// as often as this, waiting what Retry-After says within these bounds.
const (
	maxAttempts   = 6
	defaultRetry  = 2 * time.Second
	maxRetryAfter = 30 * time.Second
)

// post sends a batch, again while the server says it is busy.
func (r *ingestRun) post(ctx context.Context, batch []pending) (ingest.Result, error) {
	docs := make([]ingest.Document, len(batch))
	for i, p := range batch {
		docs[i] = p.doc
	}
	path := "/v1/kb/" + url.PathEscape(r.opts.kb) + "/documents"
	for attempt := 1; ; attempt++ {
		var res ingest.Result
		err := r.opts.client.Call(ctx, http.MethodPost, path, map[string]any{"documents": docs}, &res)
		var ae *apiclient.Error
		if !errors.As(err, &ae) || (ae.Status != http.StatusServiceUnavailable && ae.Status != http.StatusTooManyRequests) || attempt == maxAttempts {
			return res, err
		}
		wait := min(max(ae.RetryAfter, defaultRetry), maxRetryAfter)
		r.prog.note("the server is busy (%d %s); retrying in %s", ae.Status, ae.Code, wait)
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-time.After(wait):
		}
	}
}

// heldRevisions asks the kb, a page at a time, which revision of each
// document it holds; a kb that does not exist holds none.
func (r *ingestRun) heldRevisions(ctx context.Context) (map[string]string, error) {
	held := map[string]string{}
	cursor := ""
	for {
		var page struct {
			Documents []struct{ ID, Rev string }
			Next      string `json:"next_cursor"`
		}
		path := "/v1/kb/" + url.PathEscape(r.opts.kb) + "?limit=200"
		if cursor != "" {
			path += "&cursor=" + url.QueryEscape(cursor)
		}
		err := r.opts.client.Call(ctx, http.MethodGet, path, nil, &page)
		var ae *apiclient.Error
		if errors.As(err, &ae) && ae.Status == http.StatusNotFound {
			return held, nil
		}
		if err != nil {
			return nil, fmt.Errorf("ask which documents kb %s holds: %w", r.opts.kb, err)
		}
		for _, d := range page.Documents {
			held[d.ID] = d.Rev
		}
		if page.Next == "" {
			return held, nil
		}
		cursor = page.Next
	}
}

// describe names a batch's documents for an error: all of a few, else
// the first and last.
func describe(batch []pending) string {
	if len(batch) == 1 {
		return "document " + batch[0].doc.ID
	}
	if len(batch) <= 3 {
		ids := make([]string, len(batch))
		for i, p := range batch {
			ids[i] = p.doc.ID
		}
		return "documents " + strings.Join(ids, ", ")
	}
	return fmt.Sprintf("%d documents (%s … %s)", len(batch), batch[0].doc.ID, batch[len(batch)-1].doc.ID)
}
