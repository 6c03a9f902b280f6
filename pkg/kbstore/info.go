package kbstore

import (
	"context"
	"encoding/json"
	"fmt"
)

// Info describes a kb and one page of its documents, in id order. A kb
// never written has version 0 and no documents.
type Info struct {
	Name    string `json:"kb"`
	Version int64  `json:"version"`
	Model   string `json:"embedding_model,omitempty"`
	// Chunks and DocumentCount are the whole kb's, not the page's.
	Chunks        int64 `json:"chunks"`
	DocumentCount int64 `json:"document_count"`
	// Documents is the page.
	Documents []DocInfo `json:"documents"`
	// Next is the last id of this page when more follow ("" on the last
	// page): the After of the next.
	Next string `json:"-"`
}

// Page picks a page of a kb's documents.
type Page struct {
	// After is the id the page starts after ("": the first page).
	After string
	// Limit is the most documents in the page, at least 1.
	Limit int
}

// Info reads kb's description and one page of its documents, at one
// moment: a kb that changes between two pages is read as it is at each.
func (s *Store) Info(ctx context.Context, kb string, page Page) (Info, error) {
	if page.Limit < 1 {
		return Info{}, fmt.Errorf("read kb %s: a page of %d documents", kb, page.Limit)
	}
	kp := s.kbPrefix(kb)
	keys := []string{kp + "version", kp + "model", kp + "docs", kp + "info", kp + "log", kp + "ids", kp + "usage"}
	raw, err := pageScript.Run(ctx, s.rdb, keys, page.After, page.Limit).Slice()
	if err != nil {
		return Info{}, fmt.Errorf("read kb %s after %q: %w", kb, page.After, err)
	}
	if len(raw) < 5 || len(raw)%2 != 1 {
		return Info{}, fmt.Errorf("read kb %s: reply of %d values", kb, len(raw))
	}
	out := Info{Name: kb, Documents: make([]DocInfo, 0, (len(raw)-5)/2)}
	var more int64
	var ok [5]bool
	out.Version, ok[0] = raw[0].(int64)
	out.Model, ok[1] = raw[1].(string)
	out.DocumentCount, ok[2] = raw[2].(int64)
	out.Chunks, ok[3] = raw[3].(int64)
	more, ok[4] = raw[4].(int64)
	if ok != [5]bool{true, true, true, true, true} {
		return Info{}, fmt.Errorf("read kb %s: reply %v", kb, raw[:5])
	}
	for i := 5; i < len(raw); i += 2 {
		text, _ := raw[i].(string)
		var d DocInfo
		if err := json.Unmarshal([]byte(text), &d); err != nil {
			return Info{}, fmt.Errorf("decode a document's info in kb %s: %w", kb, err)
		}
		d.Version, _ = raw[i+1].(int64)
		out.Documents = append(out.Documents, d)
	}
	if more == 1 && len(out.Documents) > 0 {
		out.Next = out.Documents[len(out.Documents)-1].ID
	}
	return out, nil
}
