package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
)

// batchLines are n lines of a batch's input for the chat completions of
// the short pool's model; bad lists the line numbers (from 1) to break.
func batchLines(n int, bad ...int) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		if containsInt(bad, i) {
			b.WriteString("not a request\n")
			continue
		}
		fmt.Fprintf(&b, `{"custom_id":"req-%d","method":"POST","url":"/v1/chat/completions","body":{"model":%q,"messages":[{"role":"user","content":"Line %d."}],"max_tokens":8}}`+"\n",
			i, stack.cfg.Pools.Short.Model, i)
	}
	return b.String()
}

func containsInt(xs []int, x int) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// uploadFile posts content as a batch file with key, as a multipart form
// with the file first (as openai-go sends it).
func uploadFile(t *testing.T, key, content string) (*http.Response, map[string]any) {
	t.Helper()
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	fw, err := mw.CreateFormFile("file", "batch.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.WriteString(fw, content)
	_ = mw.WriteField("purpose", "batch")
	_ = mw.Close()
	req, _ := http.NewRequest(http.MethodPost, stack.baseURL+"/v1/files", &body)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return resp, out
}

// The official Go client uploads a batch's input and reads it back byte
// for byte; the file is listed, and gone once deleted; another tenant
// sees none of it.
func TestOpenAIGoClientFiles(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := openAIClient("k-acme")
	content := batchLines(3)
	f, err := client.Files.New(ctx, openai.FileNewParams{
		File: openai.File(strings.NewReader(content), "three.jsonl", "application/jsonl"), Purpose: openai.FilePurposeBatch,
	})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(f.ID, "file-") || f.Bytes != int64(len(content)) || f.Filename != "three.jsonl" || f.Purpose != "batch" ||
		f.ExpiresAt <= f.CreatedAt {
		t.Fatalf("uploaded %+v", f)
	}
	resp, err := client.Files.Content(ctx, f.ID)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(got) != content {
		t.Fatalf("content %q, want %q", got, content)
	}
	page, err := client.Files.List(ctx, openai.FileListParams{Purpose: openai.String("batch")})
	if err != nil || len(page.Data) == 0 || page.Data[0].ID != f.ID {
		t.Fatalf("list: %+v %v", page, err)
	}
	var apiErr *openai.Error
	other := openAIClient("k-slow")
	if _, err := other.Files.Get(ctx, f.ID); !errors.As(err, &apiErr) || apiErr.StatusCode != 404 {
		t.Fatalf("another tenant reads the file: %v", err)
	}
	if _, err := other.Files.Content(ctx, f.ID); !errors.As(err, &apiErr) || apiErr.StatusCode != 404 {
		t.Fatalf("another tenant reads the file's content: %v", err)
	}
	if _, err := other.Files.Delete(ctx, f.ID); !errors.As(err, &apiErr) || apiErr.StatusCode != 404 {
		t.Fatalf("another tenant deletes the file: %v", err)
	}
	if d, err := client.Files.Delete(ctx, f.ID); err != nil || !d.Deleted {
		t.Fatalf("delete: %+v %v", d, err)
	}
	if _, err := client.Files.Get(ctx, f.ID); !errors.As(err, &apiErr) || apiErr.StatusCode != 404 {
		t.Fatalf("a deleted file is read: %v", err)
	}
}

// A file with bad lines is refused whole, naming the first 100 of them
// with their line numbers and counting all; a file past the tenant's
// quota or the line bound is refused too; none of them is stored.
func TestBadFilesAreRefusedWithNothingStored(t *testing.T) {
	ctx := context.Background()
	before, err := stack.files.Used(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	var bad []int
	for i := 2; i <= 300; i += 2 {
		bad = append(bad, i)
	}
	resp, body := uploadFile(t, "k-acme", batchLines(300, bad...))
	e, _ := body["error"].(map[string]any)
	errs, _ := e["errors"].(map[string]any)
	data, _ := errs["data"].([]any)
	if resp.StatusCode != 400 || e["code"] != "invalid_file" || e["bad_lines"] != float64(150) || len(data) != 100 {
		t.Fatalf("%d %v, want 400 invalid_file with 150 bad lines, 100 of them listed", resp.StatusCode, e)
	}
	if first, _ := data[0].(map[string]any); first["line"] != float64(2) || first["code"] != "invalid_json" {
		t.Fatalf("first bad line %v", first)
	}
	if last, _ := data[99].(map[string]any); last["line"] != float64(200) {
		t.Fatalf("100th bad line %v", last)
	}

	unknown := strings.Replace(batchLines(2), stack.cfg.Pools.Short.Model, "gpt-nowhere", 1)
	resp, body = uploadFile(t, "k-acme", unknown)
	e, _ = body["error"].(map[string]any)
	if resp.StatusCode != 400 || e["bad_lines"] != float64(1) || !strings.Contains(fmt.Sprint(e["message"]), "line 1") {
		t.Fatalf("a line for an unknown model: %d %v", resp.StatusCode, e)
	}

	resp, body = uploadFile(t, "k-acme", batchLines(stack.cfg.Files.MaxLines+1))
	if e, _ := body["error"].(map[string]any); resp.StatusCode != 400 || e["code"] != "too_many_lines" {
		t.Fatalf("too many lines: %d %v", resp.StatusCode, body)
	}

	// The broke tier keeps 2 KiB of files.
	resp, body = uploadFile(t, keyBroke, batchLines(30))
	if e, _ := body["error"].(map[string]any); resp.StatusCode != 413 || e["code"] != "storage_quota_exceeded" {
		t.Fatalf("over the quota: %d %v", resp.StatusCode, body)
	}
	if n, err := stack.files.Used(ctx, "it-broke"); err != nil || n != 0 {
		t.Fatalf("the refused file left %d bytes (%v)", n, err)
	}
	if after, err := stack.files.Used(ctx, "acme"); err != nil || after != before {
		t.Fatalf("refused files left %d bytes (%v)", after-before, err)
	}
}
